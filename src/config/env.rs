//! The environment variables upstream reads (`KUBECONFIG`, `POD_NAMESPACE`,
//! `NODE_NAME`, `NAMESPACE`, `POD_NAME`) and the mounted service-account
//! namespace, captured once.

/// Where the pod's namespace is mounted (fallback for the Lease namespace).
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The environment upstream reads, captured once so validation stays pure
/// (tests build one instead of touching the process environment). Empty
/// variables count as unset, as Go's `os.Getenv(..) != ""` checks do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Env {
    /// `KUBECONFIG`: overrides `--kubeconfig`.
    pub kubeconfig: Option<String>,
    /// `POD_NAMESPACE`: default Lease namespace.
    pub pod_namespace: Option<String>,
    /// `NODE_NAME`: required by `--node-deployment`.
    pub node_name: Option<String>,
    /// `NAMESPACE`: where CSIStorageCapacity objects go.
    pub namespace: Option<String>,
    /// `POD_NAME`: start of the CSIStorageCapacity owner lookup.
    pub pod_name: Option<String>,
    /// Contents of [`SERVICE_ACCOUNT_NAMESPACE_FILE`]: Lease namespace when
    /// neither the flag nor `POD_NAMESPACE` gives one.
    pub service_account_namespace: Option<String>,
}

impl Env {
    /// Reads the variables through `lookup` (e.g. a map in tests); the
    /// service-account namespace is left unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Env {
        let get = |name: &str| lookup(name).filter(|v| !v.is_empty());
        Env {
            kubeconfig: get("KUBECONFIG"),
            pod_namespace: get("POD_NAMESPACE"),
            node_name: get("NODE_NAME"),
            namespace: get("NAMESPACE"),
            pod_name: get("POD_NAME"),
            service_account_namespace: None,
        }
    }

    /// The process environment and the mounted service-account namespace.
    pub fn from_process() -> Env {
        Env {
            service_account_namespace: std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE)
                .ok()
                .map(|ns| ns.trim().to_string())
                .filter(|ns| !ns.is_empty()),
            ..Env::from_lookup(|name| std::env::var(name).ok())
        }
    }
}
