// Command coredns is the cluster DNS of the real nodes (up.sh --nodes): CoreDNS from its Go
// module, with only the plugins a cluster's Corefile here uses. Upstream's own main registers
// every plugin (core/plugin); a build that names its plugins is how CoreDNS documents external
// plugin builds, and it keeps the cloud SDKs of the route53/azure/clouddns plugins out.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
