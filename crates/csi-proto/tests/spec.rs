//! `proto/csi.proto` against the CSI spec's own `csi.proto`, wire for wire.
//!
//! Both files are compiled with protox (the compiler build.rs uses) and reduced to their facts:
//! every message (nested ones too) with its fields' numbers, labels and types, its oneofs and
//! reserved numbers; every enum with its values and reserved numbers; every service with its
//! RPCs; the custom options and where they are set. The two sets of facts must be equal; a
//! difference is named exactly. Comments, order and layout are free to differ.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use protox::prost_reflect::{
    DescriptorPool, DynamicMessage, EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor,
};

/// The Go module that publishes the spec, and the version `proto/csi.proto` is written from
/// (its header says the same).
const SPEC_MODULE: &str = "github.com/container-storage-interface/spec";
const SPEC_VERSION: &str = "v1.14.0";

#[test]
fn our_proto_is_the_csi_spec_wire_for_wire() {
    let Some(spec_dir) = spec_module_dir() else {
        return;
    };
    let ours = facts(&compile(&our_proto_dir()));
    let spec = facts(&compile(&spec_dir));
    // Two empty sets would be equal too: the spec is known to say at least this much.
    for known in [
        "rpc csi.v1.Controller.CreateVolume",
        "field csi.v1.CreateVolumeRequest.secrets",
        "value csi.v1.ControllerServiceCapability.RPC.Type.CREATE_DELETE_VOLUME",
    ] {
        assert!(
            spec.contains_key(known),
            "{known:?} is not among the facts read from {}",
            spec_dir.display()
        );
    }
    let differences = differences(&ours, &spec);
    assert!(
        differences.is_empty(),
        "proto/csi.proto is not wire-compatible with CSI spec {SPEC_VERSION} \
         ({} of {} facts differ; `ours` is proto/csi.proto, `spec` is {}/csi.proto):\n  {}",
        differences.len(),
        spec.len(),
        spec_dir.display(),
        differences.join("\n  ")
    );
    eprintln!(
        "{} facts of CSI spec {SPEC_VERSION} compared: proto/csi.proto has each of them and no other",
        spec.len()
    );
}

/// The comparison itself, without Go: our file against copies of it with one thing changed.
#[test]
fn a_one_line_change_is_named_as_the_difference_it_makes() {
    let original = std::fs::read_to_string(our_proto_dir().join("csi.proto")).unwrap();
    let baseline = facts(&compile(&our_proto_dir()));
    let cases = [
        (
            "Reason reason = 4 [(alpha_field) = true];",
            "Reason reason = 5 [(alpha_field) = true];",
            "field csi.v1.ControllerUnpublishVolumeRequest.reason: \
             ours `5 csi.v1.ControllerUnpublishVolumeRequest.Reason [csi.v1.alpha_field]:true`, \
             spec `4 csi.v1.ControllerUnpublishVolumeRequest.Reason [csi.v1.alpha_field]:true`",
        ),
        (
            "repeated Topology accessible_topology = 7",
            "Topology accessible_topology = 7",
            "field csi.v1.Snapshot.accessible_topology: \
             ours `7 csi.v1.Topology [csi.v1.alpha_field]:true`, \
             spec `7 repeated csi.v1.Topology [csi.v1.alpha_field]:true`",
        ),
        (
            "map<string, string> secrets = 1 [(csi_secret) = true];",
            "map<string, bytes> secrets = 1 [(csi_secret) = true];",
            "field csi.v1.NodeGetStorageHealthRequest.secrets: \
             ours `1 map<string, bytes> [csi.v1.csi_secret]:true`, \
             spec `1 map<string, string> [csi.v1.csi_secret]:true`",
        ),
        (
            "      reserved 11;\n",
            "",
            "reserved csi.v1.ControllerServiceCapability.RPC.Type (`11`): \
             in the spec, missing from ours",
        ),
        (
            "GET_NODE_INFO = 18 [(alpha_enum_value) = true];",
            "GET_NODE_INFO = 18;",
            "value csi.v1.ControllerServiceCapability.RPC.Type.GET_NODE_INFO: \
             ours `18`, spec `18 [csi.v1.alpha_enum_value]:true`",
        ),
        (
            "    BlockVolume block = 1;\n    MountVolume mount = 2;\n  }\n",
            "    BlockVolume block = 1;\n  }\n  MountVolume mount = 2;\n",
            "oneof csi.v1.VolumeCapability.access_type: ours `block`, spec `block, mount`",
        ),
        (
            "returns (stream GetMetadataDeltaResponse)",
            "returns (GetMetadataDeltaResponse)",
            "rpc csi.v1.SnapshotMetadata.GetMetadataDelta: \
             ours `(csi.v1.GetMetadataDeltaRequest) returns (csi.v1.GetMetadataDeltaResponse)`, \
             spec `(csi.v1.GetMetadataDeltaRequest) returns (stream csi.v1.GetMetadataDeltaResponse)`",
        ),
        (
            "  GET_NODE_INFO = 18",
            "  GET_NODE_INFO_X = 18",
            "value csi.v1.ControllerServiceCapability.RPC.Type.GET_NODE_INFO (`18 \
             [csi.v1.alpha_enum_value]:true`): in the spec, missing from ours\n\
             value csi.v1.ControllerServiceCapability.RPC.Type.GET_NODE_INFO_X (`18 \
             [csi.v1.alpha_enum_value]:true`): ours only, not in the spec",
        ),
    ];
    for (from, to, expected) in cases {
        assert_eq!(original.matches(from).count(), 1, "{from:?} is not unique");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("csi.proto"), original.replace(from, to)).unwrap();
        let changed = facts(&compile(dir.path()));
        assert_eq!(
            differences(&changed, &baseline).join("\n"),
            expected,
            "after replacing {from:?} with {to:?}"
        );
    }
}

fn our_proto_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto")
}

/// The spec module's directory in the Go module cache, downloaded if need be. `None` (the test
/// is skipped, and says why) only when there is no `go` to ask.
fn spec_module_dir() -> Option<PathBuf> {
    let module = format!("{SPEC_MODULE}@{SPEC_VERSION}");
    // Away from any go.mod or go.work, so that only the module's own version counts.
    let output = match Command::new("go")
        .args(["mod", "download", "-json", &module])
        .current_dir(std::env::temp_dir())
        .env("GOWORK", "off")
        .output()
    {
        Ok(output) => output,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "SKIPPED: no `go` on PATH, so the CSI spec's csi.proto ({module}) cannot be \
                 fetched; install Go (a prerequisite of `make test`) to run this check"
            );
            return None;
        }
        Err(err) => panic!("running `go mod download -json {module}`: {err}"),
    };
    // On failure too the answer is JSON, with an "Error" field.
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!(
            "`go mod download -json {module}` did not answer JSON ({err}); stderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    if let Some(error) = answer.get("Error") {
        panic!("`go mod download -json {module}` failed: {error}");
    }
    assert!(
        output.status.success(),
        "`go mod download -json {module}` exited with {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let dir = answer["Dir"]
        .as_str()
        .unwrap_or_else(|| panic!("no \"Dir\" in the answer of `go mod download`: {answer}"));
    Some(PathBuf::from(dir))
}

/// `dir/csi.proto` and its imports, compiled.
fn compile(dir: &Path) -> DescriptorPool {
    let mut compiler = protox::Compiler::new([dir])
        .unwrap_or_else(|err| panic!("include path {}: {err}", dir.display()));
    compiler
        .open_file("csi.proto")
        .unwrap_or_else(|err| panic!("compiling {}/csi.proto: {err:?}", dir.display()));
    compiler.descriptor_pool()
}

/// What a proto file declares, as `kind full.name` → what the wire (and the options) see of
/// it. The well-known types it imports are not its own facts.
fn facts(pool: &DescriptorPool) -> BTreeMap<String, String> {
    let mut facts = BTreeMap::new();
    for file in pool
        .files()
        .filter(|f| !f.name().starts_with("google/protobuf/"))
    {
        facts.insert(
            format!("file {}", file.name()),
            format!("package {} {:?}", file.package_name(), file.syntax()),
        );
        for message in file.messages() {
            message_facts(&message, &mut facts);
        }
        for enumeration in file.enums() {
            enum_facts(&enumeration, &mut facts);
        }
        for extension in file.extensions() {
            facts.insert(
                format!("extension {}", extension.full_name()),
                format!(
                    "{} {} {}",
                    extension.containing_message().full_name(),
                    extension.number(),
                    type_name(&extension.kind())
                ),
            );
        }
        for service in file.services() {
            facts.insert(
                format!("service {}", service.full_name()),
                format!("service{}", options(&service.options())),
            );
            for method in service.methods() {
                let stream = |yes: bool| if yes { "stream " } else { "" };
                facts.insert(
                    format!("rpc {}", method.full_name()),
                    format!(
                        "({}{}) returns ({}{}){}",
                        stream(method.is_client_streaming()),
                        method.input().full_name(),
                        stream(method.is_server_streaming()),
                        method.output().full_name(),
                        options(&method.options())
                    ),
                );
            }
        }
    }
    facts
}

fn message_facts(message: &MessageDescriptor, facts: &mut BTreeMap<String, String>) {
    let name = message.full_name();
    facts.insert(
        format!("message {name}"),
        format!("message{}", options(&message.options())),
    );
    for field in message.fields() {
        facts.insert(
            format!("field {}", field.full_name()),
            format!(
                "{} {}{}",
                field.number(),
                field_type(&field),
                options(&field.options())
            ),
        );
    }
    for oneof in message.oneofs().filter(|o| !o.is_synthetic()) {
        let members: Vec<String> = oneof.fields().map(|f| f.name().to_string()).collect();
        facts.insert(format!("oneof {}", oneof.full_name()), members.join(", "));
    }
    let reserved: Vec<String> = message
        .reserved_ranges()
        .map(|r| range(r.start.into(), (r.end - 1).into()))
        .chain(message.reserved_names().map(|n| format!("{n:?}")))
        .collect();
    if !reserved.is_empty() {
        facts.insert(format!("reserved {name}"), reserved.join(", "));
    }
    // A map's entry message is part of the map field's type, not a message of its own.
    for nested in message.child_messages().filter(|m| !m.is_map_entry()) {
        message_facts(&nested, facts);
    }
    for enumeration in message.child_enums() {
        enum_facts(&enumeration, facts);
    }
}

fn enum_facts(enumeration: &EnumDescriptor, facts: &mut BTreeMap<String, String>) {
    let name = enumeration.full_name();
    facts.insert(
        format!("enum {name}"),
        format!("enum{}", options(&enumeration.options())),
    );
    // Keyed by the enum's name: protobuf scopes the values beside the enum, not in it.
    for value in enumeration.values() {
        facts.insert(
            format!("value {name}.{}", value.name()),
            format!("{}{}", value.number(), options(&value.options())),
        );
    }
    let reserved: Vec<String> = enumeration
        .reserved_ranges()
        .map(|r| range((*r.start()).into(), (*r.end()).into()))
        .chain(enumeration.reserved_names().map(|n| format!("{n:?}")))
        .collect();
    if !reserved.is_empty() {
        facts.insert(format!("reserved {name}"), reserved.join(", "));
    }
}

/// `map<K, V>`, `repeated T` (with `packed` when the wire packs it), `optional T` or `T`.
fn field_type(field: &FieldDescriptor) -> String {
    let kind = field.kind();
    if field.is_map() {
        let entry = kind
            .as_message()
            .expect("a map's type is its entry message");
        return format!(
            "map<{}, {}>",
            type_name(&entry.map_entry_key_field().kind()),
            type_name(&entry.map_entry_value_field().kind())
        );
    }
    let label = if field.is_list() {
        if field.is_packed() {
            "repeated packed "
        } else {
            "repeated "
        }
    } else if field.field_descriptor_proto().proto3_optional() {
        "optional "
    } else {
        ""
    };
    format!("{label}{}", type_name(&kind))
}

/// Messages and enums by full name, scalars by their proto keyword.
fn type_name(kind: &Kind) -> String {
    match kind {
        Kind::Message(message) => message.full_name().to_string(),
        Kind::Enum(enumeration) => enumeration.full_name().to_string(),
        scalar => format!("{scalar:?}").to_ascii_lowercase(),
    }
}

/// The options set, in protobuf text format (`[csi.v1.alpha_field]:true`), after a space; empty
/// when none is.
fn options(options: &DynamicMessage) -> String {
    let text = options.to_string();
    if text.is_empty() {
        text
    } else {
        format!(" {text}")
    }
}

fn range(first: i64, last: i64) -> String {
    if first == last {
        first.to_string()
    } else {
        format!("{first} to {last}")
    }
}

/// Every fact on which `ours` and `spec` disagree, one line each.
fn differences(ours: &BTreeMap<String, String>, spec: &BTreeMap<String, String>) -> Vec<String> {
    let mut keys: Vec<&String> = ours.keys().chain(spec.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|key| match (ours.get(key), spec.get(key)) {
            (Some(o), Some(s)) if o == s => None,
            (Some(o), Some(s)) => Some(format!("{key}: ours `{o}`, spec `{s}`")),
            (None, Some(s)) => Some(format!("{key} (`{s}`): in the spec, missing from ours")),
            (Some(o), None) => Some(format!("{key} (`{o}`): ours only, not in the spec")),
            (None, None) => None,
        })
        .collect()
}
