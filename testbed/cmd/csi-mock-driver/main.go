// csi-mock-driver serves the in-memory CSI mock service that ships inside the
// k8s.io/kubernetes module (test/e2e/storage/drivers/csi-test/mock) on a unix
// socket. It is an implementation of CSI written by other people than us, so
// running our sidecar against it checks our csi.proto against theirs.
package main

import (
	"flag"
	"log"
	"net"
	"os"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/kubernetes/test/e2e/storage/drivers/csi-test/mock/service"
)

func main() {
	endpoint := flag.String("endpoint", "", "unix socket path (optionally prefixed with unix://)")
	name := flag.String("drivername", service.Name, "driver name reported by GetPluginInfo")
	flag.Parse()
	path := strings.TrimPrefix(*endpoint, "unix://")
	if path == "" {
		log.Fatal("--endpoint is required")
	}
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		log.Fatalf("listen %s: %v", path, err)
	}
	svc := service.New(service.Config{DriverName: *name, DisableAttach: true})
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, svc)
	csi.RegisterControllerServer(srv, svc)
	csi.RegisterNodeServer(srv, svc)
	log.Printf("csi-mock-driver %s serving on %s", *name, path)
	log.Fatal(srv.Serve(lis))
}
