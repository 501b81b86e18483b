//! Unique object names, so that tests sharing one control plane never collide.

use rand::Rng;

const SUFFIX_LEN: usize = 6;
const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// `prefix` plus `-` and a short random suffix, as a valid DNS-1123 label (lower-case
/// alphanumerics and `-`, at most 63 characters, starting and ending alphanumeric), so the
/// result can name a namespace, a claim, a StorageClass or a CSI driver.
pub fn unique_name(prefix: &str) -> String {
    let mut base: String = prefix
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    base.truncate(63 - SUFFIX_LEN - 1);
    let base = base.trim_matches('-');
    let mut rng = rand::rng();
    let suffix: String = (0..SUFFIX_LEN)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    if base.is_empty() {
        // DNS-1035 names (Services, for one) must start with a letter.
        format!("t{suffix}")
    } else {
        format!("{base}-{suffix}")
    }
}
