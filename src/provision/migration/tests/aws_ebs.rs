//! AWS EBS (`kubernetes.io/aws-ebs` ↔ `ebs.csi.aws.com`).

use super::super::*;
use super::{class, csi_pv, handle_of};
use crate::keys::{PARAM_FSTYPE as FSTYPE_KEY, PLUGIN_AWS_EBS as AWS_EBS};

#[test]
fn its_class_keeps_its_parameters_and_moves_fs_type() {
    let c = translate_class(&class(AWS_EBS, &[("type", "gp2"), ("fsType", "xfs")])).unwrap();
    let params = c.parameters.clone().unwrap();
    assert_eq!(params.get("type").map(String::as_str), Some("gp2"));
    assert_eq!(params.get(FSTYPE_KEY).map(String::as_str), Some("xfs"));
    assert!(!params.contains_key("fsType"));
    assert_eq!(
        c.provisioner, AWS_EBS,
        "provisioned-by stays the in-tree name"
    );
}

#[test]
fn its_pv_is_saved_in_the_in_tree_form() {
    let mut pv = csi_pv("vol-0abc", Some("1"));
    pv_to_in_tree(AWS_EBS, &mut pv).unwrap();
    let spec = pv.spec.unwrap();
    assert!(spec.csi.is_none());
    let ebs = spec.aws_elastic_block_store.unwrap();
    assert_eq!(
        (
            ebs.volume_id.as_str(),
            ebs.fs_type.as_deref(),
            ebs.partition
        ),
        ("vol-0abc", Some("ext4"), Some(1))
    );
    let mut bad = csi_pv("vol-1", Some("x"));
    assert!(pv_to_in_tree(AWS_EBS, &mut bad).is_err());
}

#[test]
fn its_in_tree_pv_gives_the_csi_handle() {
    let ok = |r: Option<Result<String, String>>| r.unwrap().unwrap();
    let aws = |volume_id| handle_of(Source::AwsEbs { volume_id }, None);
    assert_eq!(ok(aws("vol-1")), "vol-1");
    assert_eq!(ok(aws("aws://us-east-1a/vol-1")), "vol-1");
    assert_eq!(ok(aws("aws:///vol-1")), "vol-1");
    assert!(aws("aws://z/disk-1").unwrap().is_err());
}
