module k8s.io/sample-controller

go 1.26
