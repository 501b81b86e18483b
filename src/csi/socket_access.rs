//! Why the driver's socket refused us, said so that the reader knows what to
//! change. Our image runs as root like upstream's, so this matters once a user
//! runs the sidecar as another UID: a socket the driver created as root with
//! mode 0755 then answers `EACCES`, and "transport error" alone would not say
//! which user was refused or by whom.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Who the process runs as, as the kernel checks it against the socket
/// (effective IDs and supplementary groups).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl ProcessIdentity {
    /// This process, from `/proc/self/status` (no `unsafe` `getuid` call, and
    /// present in any container: the runtime mounts `/proc`).
    pub fn current() -> Option<ProcessIdentity> {
        parse_proc_status(&std::fs::read_to_string("/proc/self/status").ok()?)
    }
}

/// Reads the effective UID and GID (the second of the four `Uid:` / `Gid:`
/// columns: real, effective, saved, filesystem) and the `Groups:` line.
pub fn parse_proc_status(status: &str) -> Option<ProcessIdentity> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|rest| rest.split_whitespace().map(str::parse::<u32>))
    };
    let uid = field("Uid:")?.nth(1)?.ok()?;
    let gid = field("Gid:")?.nth(1)?.ok()?;
    let groups = field("Groups:")
        .map(|g| g.filter_map(Result::ok).collect())
        .unwrap_or_default();
    Some(ProcessIdentity { uid, gid, groups })
}

/// The socket's owner and permission bits, when we may look at them (`stat`
/// needs only search permission on the directory, not access to the socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketOwner {
    pub uid: u32,
    pub gid: u32,
    /// The permission bits (`0o755`), without the file type.
    pub mode: u32,
}

impl SocketOwner {
    pub fn of(path: &Path) -> Option<SocketOwner> {
        let meta = std::fs::metadata(path).ok()?;
        Some(SocketOwner {
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode() & 0o7777,
        })
    }
}

/// The driver's socket (or its directory) refused to let us connect. Shown as
/// one line: who we are, who owns the socket, and what to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermissionDenied {
    pub path: PathBuf,
    pub us: Option<ProcessIdentity>,
    pub socket: Option<SocketOwner>,
}

impl PermissionDenied {
    /// Describes a refusal of `path` for this process, as it is now.
    pub fn observe(path: &Path) -> PermissionDenied {
        PermissionDenied {
            path: path.to_path_buf(),
            us: ProcessIdentity::current(),
            socket: SocketOwner::of(path),
        }
    }
}

/// Where the way to run as another user is written down.
const SEE: &str = "see \"Running as non-root\" in the README";

impl fmt::Display for PermissionDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot connect to CSI socket {}: permission denied",
            self.path.display()
        )?;
        match &self.us {
            Some(us) => {
                write!(f, " for uid {} (gid {}", us.uid, us.gid)?;
                let extra: Vec<String> = us
                    .groups
                    .iter()
                    .filter(|g| **g != us.gid)
                    .map(u32::to_string)
                    .collect();
                if !extra.is_empty() {
                    write!(f, ", groups {}", extra.join(","))?;
                }
                f.write_str(")")?;
            }
            None => f.write_str(" (our uid is unknown: /proc/self/status unreadable)")?,
        }
        match &self.socket {
            Some(s) => {
                write!(
                    f,
                    "; the socket belongs to uid {} gid {} with mode {:04o}: run the sidecar as uid {} \
                     (securityContext.runAsUser)",
                    s.uid, s.gid, s.mode, s.uid
                )?;
                // Connecting needs write permission on the socket.
                if s.mode & 0o020 != 0 {
                    write!(
                        f,
                        " or with gid {} (runAsGroup or supplementalGroups)",
                        s.gid
                    )?;
                } else {
                    write!(
                        f,
                        ", or have the driver make the socket group-writable and run with gid {} \
                         (runAsGroup or supplementalGroups)",
                        s.gid
                    )?;
                }
            }
            // Not even `stat` worked: the directory holding the socket refuses us.
            None => f.write_str(
                "; the socket's directory is not searchable by this user: run the sidecar as the \
                 driver's uid, or make the directory searchable and the socket writable for our \
                 uid or gid",
            )?,
        }
        write!(f, " ({SEE})")
    }
}

impl std::error::Error for PermissionDenied {}

/// The kind of the first `std::io::Error` in `err`'s chain of sources (tonic
/// wraps the connector's error, so the kernel's answer is some levels down).
pub fn io_error_kind(err: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tcsi-provisioner\nUmask:\t0022\nState:\tS (sleeping)\n\
        Uid:\t1000\t1001\t1001\t1001\nGid:\t2000\t2001\t2001\t2001\nFDSize:\t64\n\
        Groups:\t2001 3000 \nNStgid:\t1\n";

    #[test]
    fn the_identity_is_the_effective_uid_and_gid_with_the_supplementary_groups() {
        assert_eq!(
            parse_proc_status(STATUS),
            Some(ProcessIdentity {
                uid: 1001,
                gid: 2001,
                groups: vec![2001, 3000],
            })
        );
    }

    #[test]
    fn a_process_without_supplementary_groups_has_none() {
        let status = "Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nGroups:\t\n";
        assert_eq!(
            parse_proc_status(status),
            Some(ProcessIdentity {
                uid: 0,
                gid: 0,
                groups: vec![],
            })
        );
        assert_eq!(parse_proc_status("Name:\tx\n"), None);
    }

    #[test]
    fn this_process_knows_who_it_is() {
        assert!(ProcessIdentity::current().is_some());
    }

    fn refused(us: Option<ProcessIdentity>, socket: Option<SocketOwner>) -> String {
        PermissionDenied {
            path: "/csi/csi.sock".into(),
            us,
            socket,
        }
        .to_string()
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Option<ProcessIdentity> {
        Some(ProcessIdentity {
            uid,
            gid,
            groups: groups.to_vec(),
        })
    }

    #[test]
    fn a_root_owned_socket_names_our_uid_and_the_uid_to_run_as() {
        let line = refused(
            user(65532, 65532, &[65532]),
            Some(SocketOwner {
                uid: 0,
                gid: 0,
                mode: 0o755,
            }),
        );
        assert_eq!(
            line,
            "cannot connect to CSI socket /csi/csi.sock: permission denied for uid 65532 (gid 65532); \
             the socket belongs to uid 0 gid 0 with mode 0755: run the sidecar as uid 0 \
             (securityContext.runAsUser), or have the driver make the socket group-writable and \
             run with gid 0 (runAsGroup or supplementalGroups) (see \"Running as non-root\" in the README)"
        );
        assert!(!line.contains('\n'), "one line");
    }

    #[test]
    fn a_group_writable_socket_suggests_joining_its_group() {
        let line = refused(
            user(1000, 1000, &[1000, 44]),
            Some(SocketOwner {
                uid: 0,
                gid: 2000,
                mode: 0o660,
            }),
        );
        assert!(
            line.contains("for uid 1000 (gid 1000, groups 44)"),
            "{line}"
        );
        assert!(
            line.contains(
                "mode 0660: run the sidecar as uid 0 (securityContext.runAsUser) or with gid 2000"
            ),
            "{line}"
        );
        assert!(!line.contains("group-writable"), "{line}");
    }

    #[test]
    fn a_refusing_directory_and_an_unknown_uid_are_said_as_such() {
        let line = refused(None, None);
        assert!(line.contains("our uid is unknown"), "{line}");
        assert!(line.contains("directory is not searchable"), "{line}");
        assert!(line.ends_with("(see \"Running as non-root\" in the README)"));
    }

    #[test]
    fn the_kernels_answer_is_found_however_deeply_it_is_wrapped() {
        #[derive(Debug)]
        struct Wrapper(std::io::Error);
        impl fmt::Display for Wrapper {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("transport error")
            }
        }
        impl std::error::Error for Wrapper {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let denied = Wrapper(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        assert_eq!(
            io_error_kind(&denied),
            Some(std::io::ErrorKind::PermissionDenied)
        );
        let missing = Wrapper(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert_eq!(io_error_kind(&missing), Some(std::io::ErrorKind::NotFound));
        assert_eq!(io_error_kind(&std::fmt::Error), None);
    }
}
