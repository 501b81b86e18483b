//! PNG plots drawn with plotters into an RGB buffer, encoded with `png`.
//! Text needs a TrueType font: DejaVu Sans is looked up in the usual system
//! places; without one the plot is drawn without any text (the caller says
//! so in the report).

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;

pub struct Series {
    pub label: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Lines,
    Points,
    /// Lines with a marker at each point (few points: one per cluster size).
    LinesAndPoints,
}

pub const UPSTREAM: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
pub const OURS: RGBColor = RGBColor(0xd6, 0x27, 0x28);
pub const FLOOR: RGBColor = RGBColor(0x7f, 0x7f, 0x7f);
pub const OURS_POLICIES: RGBColor = RGBColor(0xff, 0x7f, 0x0e);

const FONT_PATHS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Registers a system font for "sans-serif" once; false if none was found.
pub fn fonts_available() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        for p in FONT_PATHS {
            if let Ok(bytes) = std::fs::read(p) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// Draws the series and writes a PNG.
pub fn draw(
    path: &Path,
    caption: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[Series],
    style: Style,
) -> anyhow::Result<()> {
    let (w, h) = (1000u32, 560u32);
    let mut buf = vec![0u8; (w * h * 3) as usize];
    let text = fonts_available();
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let x_max = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .fold(1.0f64, f64::max)
            * 1.02;
        let y_max = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.1f64, f64::max)
            * 1.05;
        let mut builder = ChartBuilder::on(&root);
        builder.margin(16);
        if text {
            builder
                .caption(caption, ("sans-serif", 22))
                .x_label_area_size(44)
                .y_label_area_size(64);
        } else {
            builder.x_label_area_size(8).y_label_area_size(8);
        }
        let mut chart = builder
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(err)?;
        let mut mesh = chart.configure_mesh();
        // Whole numbers on the x-axis of the size plots (pairs), not `1000.0`.
        let whole = |x: &f64| format!("{x:.0}");
        if style == Style::LinesAndPoints {
            mesh.x_label_formatter(&whole);
        }
        if text {
            mesh.x_desc(x_desc)
                .y_desc(y_desc)
                .label_style(("sans-serif", 15));
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw().map_err(err)?;
        for s in series {
            let color = s.color;
            let marker = if style == Style::LinesAndPoints { 4 } else { 2 };
            let points = || {
                s.points
                    .iter()
                    .map(move |&p| Circle::new(p, marker, color.filled()))
            };
            if style == Style::LinesAndPoints {
                chart.draw_series(points()).map_err(err)?;
            }
            let drawn = match style {
                Style::Points => chart.draw_series(points()).map_err(err)?,
                Style::Lines | Style::LinesAndPoints => chart
                    .draw_series(LineSeries::new(
                        s.points.iter().copied(),
                        color.stroke_width(2),
                    ))
                    .map_err(err)?,
            };
            if text {
                drawn.label(s.label.clone()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 18, y + 5)], color.filled())
                });
            }
        }
        if text {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 16))
                .position(SeriesLabelPosition::LowerRight)
                .draw()
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    let file = std::fs::File::create(path)?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Best);
    enc.write_header()?.write_image_data(&buf)?;
    Ok(())
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("plotting: {e:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png() {
        let dir = std::env::temp_dir().join(format!("bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.png");
        let s = Series {
            label: "x".into(),
            color: OURS,
            points: vec![(0.0, 0.0), (1.0, 2.0), (2.0, 3.0)],
        };
        draw(&path, "t", "x", "y", &[s], Style::LinesAndPoints).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
