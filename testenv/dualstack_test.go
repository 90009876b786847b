package testenv

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDualStackWiring builds the dualstack scenario without a datapath (every
// pod made by hand, as buildPod wires it), once in each pod wiring, and asks
// the kernels what a dual-stack pod must have whatever carries its traffic:
// its address6 (/128, not tentative: nothing waits on duplicate address
// detection), a default route via fe80::1 on eth0 (with the neighbour wiring a
// permanent entry for it), and on the node a host route to it through the host
// veth, which holds fe80::1/64. The lab leaves the node's IPv6 forwarding off
// (an agent turns it on: that is under test elsewhere), so a same-node IPv6
// ping fails; once the test itself turns forwarding on in that node, two pods
// of one node reach each other over IPv6 with ICMP, TCP and UDP, each server
// seeing the other pod's address6.
func TestDualStackWiring(t *testing.T) {
	requireRoot(t)
	for _, wiring := range []PodWiring{PodWiringNeighbour, PodWiringProxyARP} {
		name := string(wiring)
		if name == "" {
			name = "neighbour"
		}
		t.Run(name, func(t *testing.T) {
			sc, err := LoadScenario("dualstack")
			if err != nil {
				t.Fatal(err)
			}
			sc.PodWiring = wiring
			l := upScenario(t, sc, DatapathNone, time.Minute)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p1, _ := l.Pod("a1-p1")
			host := l.HostVeth("a1-p1")
			checks := []struct {
				ns, want, not string
				argv          []string
			}{
				{l.PodNS("a1-p1"), "inet6 " + p1.Address6.String() + "/128", "tentative", []string{"ip", "-6", "addr", "show", "dev", "eth0"}},
				{l.PodNS("a1-p1"), "default via fe80::1 dev eth0", "", []string{"ip", "-6", "route", "show", "default"}},
				{l.PodNS("a1-p1"), "net.ipv6.conf.eth0.accept_dad = 0", "", []string{"sysctl", "net.ipv6.conf.eth0.accept_dad"}},
				{l.NodeNS("a1"), p1.Address6.String() + " dev " + host, "", []string{"ip", "-6", "route", "show", p1.Address6.String()}},
				{l.NodeNS("a1"), "inet6 fe80::1/64", "tentative", []string{"ip", "-6", "addr", "show", "dev", host}},
				{l.NodeNS("a1"), "net.ipv6.conf.all.forwarding = 0", "", []string{"sysctl", "net.ipv6.conf.all.forwarding"}},
				// The IPv4 wiring is what it always was.
				{l.PodNS("a1-p1"), "default via 169.254.1.1 dev eth0", "", []string{"ip", "route"}},
			}
			if wiring == PodWiringNeighbour {
				checks = append(checks, struct {
					ns, want, not string
					argv          []string
				}{l.PodNS("a1-p1"), "PERMANENT", "", []string{"ip", "-6", "neigh", "show", "fe80::1", "dev", "eth0"}})
			}
			for _, c := range checks {
				out, err := l.Exec(ctx, c.ns, c.argv...)
				if err != nil {
					t.Errorf("%v", err)
					continue
				}
				if !strings.Contains(out, c.want) || (c.not != "" && strings.Contains(out, c.not)) {
					t.Errorf("%s: %s: want %q (and no %q) in:\n%s", c.ns, strings.Join(c.argv, " "), c.want, c.not, out)
				}
			}

			pairs := [][2]string{{"a1-p1", "a1-p2"}, {"a1-p2", "a1-p1"}}
			m, err := l.CheckPairs(ctx, pairs, CheckOptions{Family: IPv6, Timeout: 300 * time.Millisecond, Attempts: 1})
			if err == nil {
				t.Errorf("same-node IPv6 passed with the node's IPv6 forwarding off:\n%s", m)
			}
			if err := writeSysctls(l.NodeNS("a1"), map[string]string{"net/ipv6/conf/all/forwarding": "1"}); err != nil {
				t.Fatal(err)
			}
			m, err = l.CheckPairs(ctx, pairs, CheckOptions{Family: IPv6})
			if err != nil {
				t.Fatalf("%v\n%s", err, m)
			}
			if len(m.Probes) != 6 {
				t.Errorf("%d probes, want 6:\n%s", len(m.Probes), m)
			}
			for _, p := range m.Probes {
				src, _ := l.Pod(p.Src)
				if p.Family != IPv6 || (p.Proto != ICMP && p.Saw != src.Address6) {
					t.Errorf("%s: family %s, server saw %s; want IPv6 and %s", p.name(" -> "), p.Family, p.Saw, src.Address6)
				}
			}
			if !strings.Contains(m.String(), "IPv6 (address6 to address6):") {
				t.Errorf("matrix without its IPv6 label:\n%s", m)
			}
		})
	}
}

// TestDualStackAgents brings the dualstack scenario up as the lab runs it,
// with one isthmus agent per node (built here) and every pod added through the
// CNI plugin with its address and address6, and checks what the plugin wired:
// each pod holds its address6 with a default route via fe80::1, its node
// reserved both addresses for it and has a permanent neighbour for each pod's
// address6, the agent turned IPv6 forwarding on, and two pods of that node reach
// each other over IPv6 through pod_ingress with their own addresses at once. Across
// nodes and sites: e2e TestDualStackMesh.
func TestDualStackAgents(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := BuildBinaries(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := LoadScenario("dualstack")
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueLab(t)
	l, err := Up(ctx, sc, Options{Name: name, Binary: bin, ReadyTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(); err != nil {
			t.Error(err)
		}
		assertGone(t, name)
	})
	for _, pod := range []string{"a1-p1", "a1-p2"} {
		p, _ := l.Pod(pod)
		for _, c := range []struct {
			want string
			argv []string
		}{
			// Not tentative: the plugin turns DAD off on the pod's eth0
			// before it adds the address (the link-local one, made when
			// the link came up, may still be).
			{"inet6 " + p.Address6.String() + "/128 scope global \n", []string{"ip", "-6", "addr", "show", "dev", "eth0", "scope", "global"}},
			{"default via fe80::1 dev eth0", []string{"ip", "-6", "route", "show", "default"}},
			{"PERMANENT", []string{"ip", "-6", "neigh", "show", "fe80::1", "dev", "eth0"}},
		} {
			out, err := l.Exec(ctx, l.PodNS(pod), c.argv...)
			if err != nil || !strings.Contains(out, c.want) {
				t.Errorf("%s: %s: want %q in (%v):\n%s", pod, strings.Join(c.argv, " "), c.want, err, out)
			}
		}
	}
	rs, err := l.Reservations("a1")
	if err != nil {
		t.Fatal(err)
	}
	var reserved []string
	for _, r := range rs {
		reserved = append(reserved, r.Addr.String())
	}
	for _, pod := range []string{"a1-p1", "a1-p2"} {
		p, _ := l.Pod(pod)
		if !slices.Contains(reserved, p.Address.String()) || !slices.Contains(reserved, p.Address6.String()) {
			t.Errorf("a1 reserves %v, want %s and %s of %s among them", reserved, p.Address, p.Address6, pod)
		}
	}
	// The plugin gives the host the pods' IPv6 neighbours, as it gives the pods
	// their gateway: nothing waits on the host end's link-local address, still
	// tentative (duplicate address detection) for a second or two after ADD.
	for _, pod := range []string{"a1-p1", "a1-p2"} {
		p, _ := l.Pod(pod)
		out, err := l.Exec(ctx, l.NodeNS("a1"), "ip", "-6", "neigh", "show", p.Address6.String(), "dev", l.HostVeth(pod))
		if err != nil || !strings.Contains(out, "PERMANENT") {
			t.Errorf("a1: neighbour %s of %s: want PERMANENT (%v):\n%s", p.Address6, pod, err, out)
		}
	}
	// The agent turns IPv6 forwarding on for a node with IPv6 pods.
	fwd, err := l.Exec(ctx, l.NodeNS("a1"), "sysctl", "-n", "net.ipv6.conf.all.forwarding")
	if err != nil || strings.TrimSpace(fwd) != "1" {
		t.Errorf("a1: net.ipv6.conf.all.forwarding = %q (%v), want 1 from the agent", strings.TrimSpace(fwd), err)
	}
	m, err := l.CheckPairs(ctx, [][2]string{{"a1-p1", "a1-p2"}, {"a1-p2", "a1-p1"}}, CheckOptions{Family: IPv6})
	if err != nil {
		t.Errorf("same-node IPv6 through pod_ingress: %v\n%s", err, m)
	}
}
