//! The PV name, which is also the `CreateVolume` name and so the driver's
//! idempotency key. It depends on the claim's UID only (DESIGN §2.1), so every
//! retry of the same claim, by any replica, sends the same request.
//! upstream: pkg/controller/controller.go makeVolumeName.

use super::ProvisionError;

/// `<prefix>-<uid>` with `uuid_length == -1`; otherwise the UID without dashes,
/// cut to `uuid_length` characters. Config validation keeps `uuid_length` in
/// `-1 | 1..=32`; longer values are clamped rather than panicking.
pub fn volume_name(prefix: &str, uid: &str, uuid_length: i32) -> Result<String, ProvisionError> {
    if prefix.is_empty() {
        return Err(ProvisionError::EmptyVolumeNamePrefix);
    }
    if uid.is_empty() {
        return Err(ProvisionError::ClaimWithoutUid);
    }
    if uuid_length < 0 {
        return Ok(format!("{prefix}-{uid}"));
    }
    let compact: String = uid.chars().filter(|c| *c != '-').collect();
    let n = (uuid_length as usize).min(compact.len());
    Ok(format!("{prefix}-{}", &compact[..n]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";

    #[test]
    fn names_follow_upstream_rules() {
        let table: [(&str, i32, &str); 4] = [
            ("pvc", -1, "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"),
            ("pvc", 8, "pvc-0a1b2c3d"),
            ("vol", 32, "vol-0a1b2c3d4e5f6789abcdef0123456789"),
            ("vol", 40, "vol-0a1b2c3d4e5f6789abcdef0123456789"),
        ];
        for (prefix, len, want) in table {
            assert_eq!(volume_name(prefix, UID, len).unwrap(), want);
        }
    }

    #[test]
    fn same_uid_same_name() {
        assert_eq!(
            volume_name("pvc", UID, -1).unwrap(),
            volume_name("pvc", UID, -1).unwrap()
        );
    }

    #[test]
    fn empty_prefix_or_uid_is_an_error() {
        assert!(matches!(
            volume_name("", UID, -1),
            Err(ProvisionError::EmptyVolumeNamePrefix)
        ));
        assert!(matches!(
            volume_name("pvc", "", -1),
            Err(ProvisionError::ClaimWithoutUid)
        ));
    }
}
