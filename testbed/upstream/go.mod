// Test bed, part three: the upstream external-provisioner sidecar we compare ours
// with, at the release the docs name (v6.4.0). A module of its own so that its
// build list is the release's, not the control plane's: v6.4.0's go.mod replaces
// every k8s.io staging module with v0.36.1 (those replaces apply only in a main
// module, so they are repeated below, as its release build applies them), while the
// control plane pins v0.36.3. Its cache key is separate: moving it never rebuilds
// kube-apiserver. testbed/build.sh also copies the release's
// deploy/kubernetes/rbac.yaml from this module. Nothing imports it.
module csi-provisioner.invalid/testbed/upstream

go 1.26.0

tool github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner

require (
	cel.dev/expr v0.25.3 // indirect
	github.com/NYTimes/gziphandler v1.1.1 // indirect
	github.com/antlr4-go/antlr/v4 v4.13.1 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/blang/semver/v4 v4.0.0 // indirect
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/container-storage-interface/spec v1.13.0 // indirect
	github.com/coreos/go-semver v0.3.1 // indirect
	github.com/coreos/go-systemd/v22 v22.7.0 // indirect
	github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc // indirect
	github.com/emicklei/go-restful/v3 v3.13.0 // indirect
	github.com/evanphx/json-patch/v5 v5.9.11 // indirect
	github.com/felixge/httpsnoop v1.1.0 // indirect
	github.com/fsnotify/fsnotify v1.10.1 // indirect
	github.com/fxamacker/cbor/v2 v2.9.4 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/go-logr/zapr v1.3.0 // indirect
	github.com/go-openapi/jsonpointer v1.0.2 // indirect
	github.com/go-openapi/jsonreference v1.0.3 // indirect
	github.com/go-openapi/swag v0.29.2 // indirect
	github.com/go-openapi/swag/cmdutils v0.29.2 // indirect
	github.com/go-openapi/swag/conv v0.29.2 // indirect
	github.com/go-openapi/swag/fileutils v0.29.2 // indirect
	github.com/go-openapi/swag/jsonutils v0.29.2 // indirect
	github.com/go-openapi/swag/loading v0.29.2 // indirect
	github.com/go-openapi/swag/mangling v0.29.2 // indirect
	github.com/go-openapi/swag/netutils v0.29.2 // indirect
	github.com/go-openapi/swag/pools v0.29.2 // indirect
	github.com/go-openapi/swag/stringutils v0.29.2 // indirect
	github.com/go-openapi/swag/typeutils v0.29.2 // indirect
	github.com/go-openapi/swag/yamlutils v0.29.2 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/google/cel-go v0.31.0 // indirect
	github.com/google/gnostic-models v0.7.1 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus v1.1.0 // indirect
	github.com/grpc-ecosystem/go-grpc-middleware/v2 v2.3.4 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.31.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/kubernetes-csi/csi-lib-utils v0.25.0 // indirect
	github.com/kubernetes-csi/external-provisioner/v6 v6.4.0 // indirect
	github.com/kubernetes-csi/external-snapshotter/client/v8 v8.6.0 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/miekg/dns v1.1.73 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.3-0.20250322232337-35a7c28c31ee // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pmezard/go-difflib v1.0.1-0.20181226105442-5d4384ee4fb2 // indirect
	github.com/prometheus/client_golang v1.24.1 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/spf13/cobra v1.10.2 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	go.etcd.io/etcd/api/v3 v3.7.2 // indirect
	go.etcd.io/etcd/client/pkg/v3 v3.7.2 // indirect
	go.etcd.io/etcd/client/v3 v3.7.2 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc v0.71.0 // indirect
	go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp v0.71.0 // indirect
	go.opentelemetry.io/otel v1.46.0 // indirect
	go.opentelemetry.io/otel/exporters/otlp/otlptrace v1.46.0 // indirect
	go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc v1.46.0 // indirect
	go.opentelemetry.io/otel/metric v1.46.0 // indirect
	go.opentelemetry.io/otel/sdk v1.46.0 // indirect
	go.opentelemetry.io/otel/trace v1.46.0 // indirect
	go.opentelemetry.io/proto/otlp v1.11.1 // indirect
	go.uber.org/automaxprocs v1.6.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.28.0 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/exp v0.0.0-20260908205506-85c1c2202aba // indirect
	golang.org/x/net v0.59.0 // indirect
	golang.org/x/oauth2 v0.37.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/term v0.46.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260928230214-8a89bd6388cc // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260928230214-8a89bd6388cc // indirect
	google.golang.org/grpc v1.84.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	gopkg.in/evanphx/json-patch.v4 v4.13.0 // indirect
	gopkg.in/inf.v0 v0.9.1 // indirect
	k8s.io/api v0.37.0 // indirect
	k8s.io/apimachinery v0.37.0 // indirect
	k8s.io/apiserver v0.37.0 // indirect
	k8s.io/client-go v0.37.0 // indirect
	k8s.io/component-base v0.37.0 // indirect
	k8s.io/component-helpers v0.36.1 // indirect
	k8s.io/csi-translation-lib v0.36.1 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
	k8s.io/kube-openapi v0.0.0-20260821135717-be32def86098 // indirect
	k8s.io/streaming v0.37.0 // indirect
	k8s.io/utils v0.0.0-20260707023825-cf1189d6abe3 // indirect
	sigs.k8s.io/apiserver-network-proxy/konnectivity-client v0.37.0 // indirect
	sigs.k8s.io/controller-runtime v0.25.2 // indirect
	sigs.k8s.io/gateway-api v1.6.2 // indirect
	sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730 // indirect
	sigs.k8s.io/randfill v1.0.0 // indirect
	sigs.k8s.io/sig-storage-lib-external-provisioner/v13 v13.1.0 // indirect
	sigs.k8s.io/structured-merge-diff/v6 v6.4.2 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)

replace k8s.io/cli-runtime => k8s.io/cli-runtime v0.36.1

replace k8s.io/cloud-provider => k8s.io/cloud-provider v0.36.1

replace k8s.io/cluster-bootstrap => k8s.io/cluster-bootstrap v0.36.1

replace k8s.io/code-generator => k8s.io/code-generator v0.36.1

replace k8s.io/controller-manager => k8s.io/controller-manager v0.36.1

replace k8s.io/cri-api => k8s.io/cri-api v0.36.1

replace k8s.io/cri-client => k8s.io/cri-client v0.36.1

replace k8s.io/dynamic-resource-allocation => k8s.io/dynamic-resource-allocation v0.36.1

replace k8s.io/endpointslice => k8s.io/endpointslice v0.36.1

replace k8s.io/externaljwt => k8s.io/externaljwt v0.36.1

replace k8s.io/kms => k8s.io/kms v0.36.1

replace k8s.io/kube-aggregator => k8s.io/kube-aggregator v0.36.1

replace k8s.io/kube-controller-manager => k8s.io/kube-controller-manager v0.36.1

replace k8s.io/kube-proxy => k8s.io/kube-proxy v0.36.1

replace k8s.io/kube-scheduler => k8s.io/kube-scheduler v0.36.1

replace k8s.io/kubectl => k8s.io/kubectl v0.36.1

replace k8s.io/kubelet => k8s.io/kubelet v0.36.1

replace k8s.io/metrics => k8s.io/metrics v0.36.1

replace k8s.io/mount-utils => k8s.io/mount-utils v0.36.1

replace k8s.io/pod-security-admission => k8s.io/pod-security-admission v0.36.1

replace k8s.io/sample-apiserver => k8s.io/sample-apiserver v0.36.1

replace k8s.io/sample-cli-plugin => k8s.io/sample-cli-plugin v0.36.1

replace k8s.io/sample-controller => k8s.io/sample-controller v0.36.1

replace k8s.io/api => k8s.io/api v0.36.1

replace k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.36.1

replace k8s.io/apimachinery => k8s.io/apimachinery v0.36.1

replace k8s.io/apiserver => k8s.io/apiserver v0.36.1

replace k8s.io/client-go => k8s.io/client-go v0.36.1

replace k8s.io/component-base => k8s.io/component-base v0.36.1

replace k8s.io/component-helpers => k8s.io/component-helpers v0.36.1

replace k8s.io/cri-streaming => k8s.io/cri-streaming v0.36.1

replace k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.36.1

replace k8s.io/streaming => k8s.io/streaming v0.36.1
