// CoreDNS for the local cluster's worker node, with only the plugins its Corefile uses.
// Upstream's main (github.com/coredns/coredns/coredns.go) imports core/plugin, which pulls in
// every plugin and its cloud SDKs (route53, azure, clouddns, ...); importing the few we use
// keeps the cold build short. The plugins and coremain are upstream's, unchanged.
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
