//! The PV name, which is also the `CreateVolume` name and so the driver's
//! idempotency key. It depends on the claim's UID only (DESIGN §2.1), so every
//! retry of the same claim, by any replica, sends the same request.
//! upstream: pkg/controller/controller.go makeVolumeName.

use super::ProvisionError;

/// `<prefix>-<uid>` without `uuid_length` (`--volume-name-uuid-length=-1`);
/// otherwise the UID without dashes, cut to `uuid_length` characters. Config
/// validation keeps `uuid_length` in `1..=32`; longer values are clamped
/// rather than panicking.
pub fn volume_name(
    prefix: &str,
    uid: &str,
    uuid_length: Option<usize>,
) -> Result<String, ProvisionError> {
    if prefix.is_empty() {
        return Err(ProvisionError::EmptyVolumeNamePrefix);
    }
    if uid.is_empty() {
        return Err(ProvisionError::ClaimWithoutUid);
    }
    let Some(uuid_length) = uuid_length else {
        return Ok(format!("{prefix}-{uid}"));
    };
    let compact: String = uid.chars().filter(|c| *c != '-').collect();
    let n = uuid_length.min(compact.len());
    Ok(format!("{prefix}-{}", &compact[..n]))
}

/// A claim UID as a volume name carries it ([`volume_name`] read backwards):
/// the whole UID, or (`--volume-name-uuid-length=n`) its first `n` characters
/// with the dashes removed, which many claims may share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UidInName {
    Whole(String),
    Start(String),
}

impl UidInName {
    /// What the name shows of the UID, as written there.
    pub fn as_str(&self) -> &str {
        match self {
            UidInName::Whole(s) | UidInName::Start(s) => s,
        }
    }

    /// Whether the claim with `uid` could have made this name.
    pub fn matches(&self, uid: &str) -> bool {
        match self {
            UidInName::Whole(s) => s.eq_ignore_ascii_case(uid),
            UidInName::Start(start) => {
                let compact: String = uid.chars().filter(|c| *c != '-').collect();
                compact.len() >= start.len() && compact[..start.len()].eq_ignore_ascii_case(start)
            }
        }
    }
}

/// Finds a name [`volume_name`] makes (`<prefix>-<uid>`) inside `text`, such as
/// a driver's volume ID that embeds the `CreateVolume` name
/// (`projects/p/disks/pvc-<uid>`, `vol-7-pvc-<uid>`). The name must stand on
/// its own: neither side may run on into letters or digits.
pub fn uid_in_name(text: &str, prefix: &str, uuid_length: Option<usize>) -> Option<UidInName> {
    if prefix.is_empty() {
        return None;
    }
    let lead = format!("{prefix}-");
    let (len, whole) = match uuid_length {
        None => (36, true),
        Some(n) => (n.min(32), false),
    };
    text.match_indices(&lead).find_map(|(at, _)| {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric()) {
            return None;
        }
        let rest = &text[at + lead.len()..];
        let candidate = rest.get(..len)?;
        let after = rest[len..].chars().next();
        if after.is_some_and(|c| c.is_ascii_alphanumeric()) {
            return None;
        }
        let shaped = if whole {
            is_uuid(candidate)
        } else {
            candidate.bytes().all(|b| b.is_ascii_hexdigit())
        };
        shaped.then(|| {
            if whole {
                UidInName::Whole(candidate.to_string())
            } else {
                UidInName::Start(candidate.to_string())
            }
        })
    })
}

/// `8-4-4-4-12` hexadecimal digits: how Kubernetes writes a UID.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";

    #[test]
    fn names_follow_upstream_rules() {
        let table: [(&str, Option<usize>, &str); 4] = [
            ("pvc", None, "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"),
            ("pvc", Some(8), "pvc-0a1b2c3d"),
            ("vol", Some(32), "vol-0a1b2c3d4e5f6789abcdef0123456789"),
            ("vol", Some(40), "vol-0a1b2c3d4e5f6789abcdef0123456789"),
        ];
        for (prefix, len, want) in table {
            assert_eq!(volume_name(prefix, UID, len).unwrap(), want);
        }
    }

    #[test]
    fn same_uid_same_name() {
        assert_eq!(
            volume_name("pvc", UID, None).unwrap(),
            volume_name("pvc", UID, None).unwrap()
        );
    }

    #[test]
    fn empty_prefix_or_uid_is_an_error() {
        assert!(matches!(
            volume_name("", UID, None),
            Err(ProvisionError::EmptyVolumeNamePrefix)
        ));
        assert!(matches!(
            volume_name("pvc", "", None),
            Err(ProvisionError::ClaimWithoutUid)
        ));
    }
    #[test]
    fn the_uid_is_read_back_from_a_name_or_an_id_that_embeds_it() {
        for len in [None, Some(8), Some(32)] {
            let name = volume_name("pvc", UID, len).unwrap();
            for text in [
                name.clone(),
                format!("vol-000007-{name}"),
                format!("projects/p/zones/z/disks/{name}"),
                format!("{name}#share"),
            ] {
                let found = uid_in_name(&text, "pvc", len).unwrap_or_else(|| panic!("{text}"));
                assert!(found.matches(UID), "{text}: {found:?}");
                assert!(!found.matches("ffffffff-4e5f-6789-abcd-ef0123456789"));
            }
        }
        assert_eq!(
            uid_in_name(&format!("pvc-{UID}"), "pvc", None),
            Some(UidInName::Whole(UID.into()))
        );
        assert_eq!(
            uid_in_name("pvc-0a1b2c3d", "pvc", Some(8)),
            Some(UidInName::Start("0a1b2c3d".into()))
        );
    }

    #[test]
    fn text_that_only_looks_like_a_name_carries_no_uid() {
        let table: [(&str, &str, Option<usize>); 8] = [
            ("vol-000001-1a2b3c4d", "pvc", None),
            ("pvc-not-a-uid", "pvc", None),
            // Runs on into more characters on either side.
            ("xpvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789", "pvc", None),
            ("pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789a", "pvc", None),
            ("pvc-0a1b2c3d4", "pvc", Some(8)),
            ("pvc-0a1b2c3", "pvc", Some(8)),
            ("pvc-0a1b2c3g", "pvc", Some(8)),
            ("vol-0a1b2c3d-4e5f-6789-abcd-ef0123456789", "pvc", None),
        ];
        for (text, prefix, len) in table {
            assert_eq!(uid_in_name(text, prefix, len), None, "{text}");
        }
        // A later occurrence is still found after one that does not fit.
        let text = format!("pvc-x/pvc-{UID}");
        assert!(uid_in_name(&text, "pvc", None).unwrap().matches(UID));
    }
}
