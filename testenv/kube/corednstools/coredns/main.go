// Command coredns is CoreDNS (github.com/coredns/coredns, the version
// go.mod requires) with the plugins of the lab's Corefile alone
// (testenv/clusterdns/coredns.yaml) and bind, with which its test
// (TestCorefileAnswersFromAPI) keeps a CoreDNS on the host to loopback.
// It is assembled as CoreDNS documents for a build with chosen plugins: a
// main package that imports coremain and those plugins and sets
// dnsserver.Directives. The stock build compiles every
// plugin in (the cloud DNS providers with their SDKs, etcd, tracing), most
// of its build time, for directives the Corefile never names. The plugins
// run in the stock order: Directives is the release's own list, filtered.
//
// A directive the Corefile names but this build lacks fails CoreDNS's start
// with "Unknown directive": add its plugin to plugins, and its import. This
// file is part of the binary cache's key (kubebin), so a change rebuilds.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// plugins are the directives of the lab's Corefile and bind, each the name a
// plugin above registers (plugin/metrics registers "prometheus").
var plugins = map[string]bool{
	"bind": true, "errors": true, "health": true, "ready": true, "kubernetes": true, "prometheus": true,
	"cache": true, "loop": true, "reload": true, "loadbalance": true,
}

func init() {
	var order []string
	for _, d := range dnsserver.Directives {
		if plugins[d] {
			order = append(order, d)
		}
	}
	dnsserver.Directives = order
}

func main() {
	coremain.Run()
}
