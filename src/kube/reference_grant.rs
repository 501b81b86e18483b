//! ReferenceGrant (`gateway.networking.k8s.io/v1beta1`, a CRD of the Gateway
//! API, read as upstream reads it): which kinds in other namespaces may refer
//! to objects of the grant's namespace. Only the fields the check of a
//! cross-namespace data source reads (`provision::grant`).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::NamespaceResourceScope;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "gateway.networking.k8s.io";

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ReferenceGrant {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ReferenceGrantSpec,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ReferenceGrantSpec {
    /// Who may refer: kind and namespace (and group) of the referring object.
    #[serde(default)]
    pub from: Vec<GrantFrom>,
    /// What may be referred to in the grant's namespace: group, kind, and
    /// one name or (none) every object of the kind.
    #[serde(default)]
    pub to: Vec<GrantTo>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct GrantFrom {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct GrantTo {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl kube::Resource for ReferenceGrant {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ReferenceGrant".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1beta1".into()
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        "gateway.networking.k8s.io/v1beta1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "referencegrants".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
