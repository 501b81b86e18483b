//! Compiles `proto/csi.proto` with protox (pure Rust, no system protoc) and generates the
//! gRPC clients and servers with tonic.
//!
//! Secrets are redacted by construction: every message with a field named `secrets` is generated
//! without a derived `Debug`, and this script writes a hand-shaped `Debug` impl for each of them
//! (into `OUT_DIR/csi.v1.redacted_debug.rs`) that prints every other field normally and only the
//! number of secret keys. A new message with secrets in a future spec gets the same treatment
//! without anyone remembering to add it.

use std::fmt::Write as _;
use std::path::PathBuf;

use prost_types::field_descriptor_proto::Label;
use prost_types::{DescriptorProto, FileDescriptorSet};

const PROTO: &str = "../../proto/csi.proto";
const PACKAGE: &str = "csi.v1";
const SECRETS_FIELD: &str = "secrets";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed=build.rs");

    let proto = PathBuf::from(PROTO);
    let include = proto.parent().ok_or("proto path has no parent")?;
    let fds = protox::compile([&proto], [include])?;

    let secret_messages = messages_with_secrets(&fds);
    if secret_messages.is_empty() {
        return Err("no message with a `secrets` field found: is this really csi.proto?".into());
    }

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join(format!("{PACKAGE}.redacted_debug.rs")),
        render_debug_impls(&secret_messages),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .skip_debug(secret_messages.iter().map(|m| m.proto_path.clone()))
        .compile_fds(fds)?;
    Ok(())
}

/// A message that carries secrets, with what the Debug generator needs to know about it.
struct SecretMessage {
    /// Fully qualified protobuf path, as prost-build expects it (`.csi.v1.CreateVolumeRequest`).
    proto_path: String,
    /// Rust path relative to the generated `csi.v1` module (`CreateVolumeRequest`,
    /// `outer::Inner`).
    rust_path: String,
    /// Message name as shown by Debug.
    name: String,
    fields: Vec<DebugField>,
}

enum DebugField {
    /// Printed through the Rust field's own Debug. Enum-typed fields would show their `i32`
    /// (none of the secret-bearing CSI messages has one).
    Plain { label: String, ident: String },
    /// Never printed: only how many entries it holds (for maps and repeated fields).
    Secret {
        label: String,
        ident: String,
        countable: bool,
    },
}

fn messages_with_secrets(fds: &FileDescriptorSet) -> Vec<SecretMessage> {
    let mut found = Vec::new();
    for file in fds.file.iter().filter(|f| f.package() == PACKAGE) {
        for message in &file.message_type {
            collect(message, &format!(".{PACKAGE}"), &[], &mut found);
        }
    }
    found
}

fn collect(
    message: &DescriptorProto,
    proto_parent: &str,
    rust_modules: &[String],
    found: &mut Vec<SecretMessage>,
) {
    let proto_path = format!("{proto_parent}.{}", message.name());
    let mut nested_modules = rust_modules.to_vec();
    nested_modules.push(snake_case(message.name()));
    for nested in &message.nested_type {
        // Map entries are synthetic messages, never Rust types of their own.
        if nested.options.as_ref().and_then(|o| o.map_entry) != Some(true) {
            collect(nested, &proto_path, &nested_modules, found);
        }
    }

    if !message.field.iter().any(|f| f.name() == SECRETS_FIELD) {
        return;
    }

    let mut fields = Vec::new();
    let mut oneofs_done = Vec::new();
    for field in &message.field {
        // Members of a real oneof live in a single Rust field named after the oneof.
        if let Some(index) = field.oneof_index.filter(|_| !field.proto3_optional()) {
            if oneofs_done.contains(&index) {
                continue;
            }
            oneofs_done.push(index);
            let oneof = message.oneof_decl[index as usize].name();
            fields.push(DebugField::Plain {
                label: oneof.to_string(),
                ident: rust_ident(&snake_case(oneof)),
            });
            continue;
        }
        let label = field.name().to_string();
        let ident = rust_ident(&snake_case(field.name()));
        if field.name() == SECRETS_FIELD {
            // Maps are repeated entries on the wire, so this covers map<string,string>.
            let countable = field.label() == Label::Repeated;
            fields.push(DebugField::Secret {
                label,
                ident,
                countable,
            });
        } else {
            fields.push(DebugField::Plain { label, ident });
        }
    }

    let mut rust_path = rust_modules.join("::");
    if !rust_path.is_empty() {
        rust_path.push_str("::");
    }
    rust_path.push_str(message.name());

    found.push(SecretMessage {
        proto_path,
        rust_path,
        name: message.name().to_string(),
        fields,
    });
}

fn render_debug_impls(messages: &[SecretMessage]) -> String {
    let mut out = String::from(
        "// @generated by csi-proto's build.rs: Debug for every message with a `secrets` field.\n\
         // The secret values are never formatted; only the number of entries is shown.\n\n",
    );
    for message in messages {
        let _ = writeln!(out, "impl ::core::fmt::Debug for {} {{", message.rust_path);
        out.push_str(
            "    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {\n",
        );
        let _ = writeln!(out, "        f.debug_struct({:?})", message.name);
        for field in &message.fields {
            match field {
                DebugField::Plain { label, ident } => {
                    let _ = writeln!(out, "            .field({label:?}, &self.{ident})");
                }
                DebugField::Secret {
                    label,
                    ident,
                    countable: true,
                } => {
                    let _ = writeln!(
                        out,
                        "            .field({label:?}, &crate::RedactedSecrets::counted(self.{ident}.len()))"
                    );
                }
                DebugField::Secret {
                    label,
                    countable: false,
                    ..
                } => {
                    let _ = writeln!(
                        out,
                        "            .field({label:?}, &crate::RedactedSecrets::opaque())"
                    );
                }
            }
        }
        out.push_str("            .finish()\n    }\n}\n\n");
    }
    out
}

/// The snake_case conversion prost applies to module and field names, for the names CSI uses
/// (ASCII identifiers, CamelCase messages, snake_case fields).
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    let chars: Vec<char> = name.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() {
            let prev_lower =
                i > 0 && (chars[i - 1].is_ascii_lowercase() || chars[i - 1].is_ascii_digit());
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            let prev_upper = i > 0 && chars[i - 1].is_ascii_uppercase();
            if i > 0 && (prev_lower || (prev_upper && next_lower)) && !out.ends_with('_') {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Escapes Rust keywords the way prost does (`type` → `r#type`).
fn rust_ident(name: &str) -> String {
    const KEYWORDS: &[&str] = &[
        "as", "async", "await", "break", "const", "continue", "dyn", "else", "enum", "extern",
        "false", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "match", "mod", "move",
        "mut", "pub", "ref", "return", "static", "struct", "trait", "true", "try", "type",
        "unsafe", "use", "where", "while", "abstract", "become", "box", "do", "final", "macro",
        "override", "priv", "typeof", "unsized", "virtual", "yield",
    ];
    match name {
        // These cannot be raw identifiers; prost appends an underscore.
        "self" | "super" | "crate" | "Self" => format!("{name}_"),
        _ if KEYWORDS.contains(&name) => format!("r#{name}"),
        _ => name.to_string(),
    }
}
