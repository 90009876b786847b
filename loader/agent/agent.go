// Package agent is the isthmus agent loop: it loads the datapath, attaches it to the
// underlay device, isthmus0 and every pod interface matching the configured
// patterns, and keeps the pinned maps and the routes equal to the plan computed
// from the objects of a source.Source (a directory of YAML, or the Kubernetes
// API). It reacts to changes of the objects, to pod interfaces coming and going,
// and resyncs periodically. Every sync diffs against what the kernel holds and
// writes only the difference. Invalid objects are set aside (see
// objects.ValidateSettingAside) and reported once per change; only a failure to
// plan this node itself leaves the last good state in force.
//
// All kernel work happens on the goroutine that calls Start and Run, so a caller
// that locked its thread into a network namespace gets the agent in that namespace.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/loader/health"
	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/loader/mapstate"
	"github.com/isthmus-dev/isthmus/loader/metrics"
	"github.com/isthmus-dev/isthmus/loader/objects"
	"github.com/isthmus-dev/isthmus/loader/plan"
	"github.com/isthmus-dev/isthmus/loader/source"
	"github.com/isthmus-dev/isthmus/maps"
)

// Config is what the agent is told on its command line.
type Config struct {
	Node string
	// Source hands the agent its objects; the agent does not close it. Nil
	// means a source.Files on ObjectsDir, which the agent owns, checking
	// Rules. Exactly one of Source and ObjectsDir must be set.
	Source     source.Source
	ObjectsDir string
	Rules      objects.Rules
	// UnderlayDev is the underlay device; empty means the one holding the node's
	// InternalIP.
	UnderlayDev string
	// PinDir is where maps and links are pinned (on bpffs); empty means
	// datapath.DefaultPinDir.
	PinDir string
	// PodPatterns are shell globs for pod-facing interfaces.
	PodPatterns []string
	// IPAMDir, when set, is the CNI plugin's reservation store (loader/ipam):
	// a pod interface named in a reservation accepts only the addresses
	// reserved for it (pod_addrs). It is read at every sync: the plugin
	// reserves before it creates the veth, whose link event syncs, and DEL
	// removes the veth first.
	IPAMDir string
	Decap   datapath.DecapMode
	// VNI is the GENEVE VNI (24 bits).
	VNI uint32
	// ReadyFile, if set, is written after the first full sync.
	ReadyFile string
	// NatEntries is the size of the SNAT connection table and of the
	// masquerade one (0: the default, datapath.DefaultNatEntries).
	NatEntries uint32
	// NatSourceFlows is how many flows one pod source may hold in each of them
	// (0: datapath.DefaultNatSourceFlows(NatEntries)).
	NatSourceFlows uint32
	// SNATPortMin and SNATPortMax bound the ports return-path SNAT picks when a
	// flow's own port is taken (0, 0: DefaultSNATPortMin..DefaultSNATPortMax).
	SNATPortMin, SNATPortMax uint16
	// HealthPort, HealthInterval, HealthMultiplier and HealthRise configure the
	// health checks of next-hop group members (0: health.DefaultPort,
	// DefaultInterval, DefaultMultiplier, DefaultRise).
	HealthPort       int
	HealthInterval   time.Duration
	HealthMultiplier int
	HealthRise       int
	// HealthReachExpiry is how long the datapath answers probes from this
	// agent's last claims when it stops refreshing them (0:
	// health.DefaultReachExpiry).
	HealthReachExpiry time.Duration
	// Resync is the period of full resyncs (default 30s): the objects are read
	// again and the kernel state diffed. Debounce is the quiet time a burst of
	// changes in ObjectsDir must leave before it is read (default
	// source.DefaultDebounce; a lone change is read source.Settle after it).
	Resync, Debounce time.Duration
	Log              *slog.Logger
	// Planner computes the node's plan from a validated Set; nil means
	// CachedPlanner with a Cache of the agent's own.
	Planner func(set *objects.Set, node string) (*plan.NodePlan, []string, error)
	// Status, if set, is kept up to date for /healthz and /readyz; Metrics, if
	// set, records every sync.
	Status  *Status
	Metrics *metrics.Sync
	// WireGuard configures the device of encrypted peers (wireguard.go).
	WireGuard WireGuardConfig
}

// Agent is a started agent. Its methods must be called from the goroutine that
// called Start.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	src      source.Source
	ownSrc   bool // src was opened by Start and is closed by Close
	dp       *datapath.Datapath
	plan     *plan.NodePlan
	underlay netlink.Link
	xdp      bool
	overlay  datapath.Overlay
	pods     map[string]int // attached pod interface name -> ifindex
	// podNoPeer holds the attached pod interfaces (ifindex) that are no
	// veth or netkit, such as a bridge: pod_ifaces flag PodIfaceFlagNoPeer.
	podNoPeer map[int]bool
	// health checks group members from the tunnel address healthAddr; nil when
	// the node has no tunnel address (every member then counts as up). down is
	// the last set of members it reported down.
	health     *health.Checker
	healthAddr netip.Addr
	down       map[maps.GroupMember]bool
	st         *Status // never nil
	// reported holds the lines last logged per group (set-aside objects,
	// warnings), so a resync that finds the same problems logs nothing.
	reported map[string]map[string]bool
	// loadedGen is the source's Generation at the last successful load
	// (loaded false before one, or with a source that does not count).
	loadedGen uint64
	loaded    bool
	// changedSince is when the oldest change in the plan not yet in the
	// maps reached the source (source.ChangeTimes; zero: none, or a source
	// that does not tell): the sync that writes the plan to the maps records
	// the time from it (metrics.Sync.EventToMaps).
	changedSince time.Time
	// fibDirect is what the last sync found of the node's policy rules:
	// maps.ConfigFlagFIBDirect (datapath.DirectFIB); fibDirectWhy is why not.
	fibDirect    bool
	fibDirectWhy string
	// wg is the WireGuard device of encrypted peers and the node's key.
	wg wireGuardState
	// ruleWatch is set while Run watches the policy rules, ruleWatchLost once
	// that watch has stopped.
	ruleWatch, ruleWatchLost bool
	// resize is set when the plan outgrew a map (maps.ErrCapacity) and growing
	// it in place failed: Run returns it, so the agent restarts and sizes the maps again.
	resize error
	// ipv6Forwarding: ensureIPv6Forwarding has turned IPv6 forwarding on.
	ipv6Forwarding bool
	// ipv6MTUWarned: routes has said that the tunnel MTU leaves IPv6 pods
	// uncarried, for the MTU it holds.
	ipv6MTUWarned int
}

// minIPv6MTU is the smallest MTU IPv6 runs on (RFC 8200 section 5): Linux turns
// IPv6 off on a device whose MTU is below it.
const minIPv6MTU = 1280

// The default return-path SNAT port range: above Linux's default ephemeral range
// (net.ipv4.ip_local_port_range 32768-60999), so a translated flow never takes a
// port the node's own connections from its tunnel address (health probes, host
// traffic into the tunnel) would pick, and outside NodePorts (30000-32767).
const (
	DefaultSNATPortMin = 61000
	DefaultSNATPortMax = 65535
)

// Run starts the agent and runs it until ctx is done. On return everything stays in
// place (pinned); see datapath.Uninstall.
func Run(ctx context.Context, cfg Config) error {
	a, err := start(ctx, cfg, true)
	if err != nil {
		return err
	}
	defer a.Close()
	return a.Run(ctx)
}

// DefaultPlanner computes node's plan with plan.Compute and returns its
// warnings and corrections as text.
func DefaultPlanner(set *objects.Set, node string) (*plan.NodePlan, []string, error) {
	return planned(node)(plan.Compute(set, node))
}

// CachedPlanner is DefaultPlanner computing through c, which reuses the
// parts of the last plan a change leaves alone (plan.Cache: the same plan,
// less work after a one-Node change).
func CachedPlanner(c *plan.Cache) func(set *objects.Set, node string) (*plan.NodePlan, []string, error) {
	return func(set *objects.Set, node string) (*plan.NodePlan, []string, error) {
		return planned(node)(c.Compute(set, node))
	}
}

// planned returns what a Planner returns for node's plan p: its warnings
// and corrections as text.
func planned(node string) func(p *plan.NodePlan, err error) (*plan.NodePlan, []string, error) {
	return func(p *plan.NodePlan, err error) (*plan.NodePlan, []string, error) {
		if err != nil {
			return nil, nil, fmt.Errorf("compute plan for %s: %w", node, err)
		}
		out := slices.Clone(p.Warnings)
		for _, c := range p.Corrections {
			out = append(out, correctionText(c))
		}
		return p, out, nil
	}
}

// correctionText says what cut a route: a tunnel endpoint inside it, or one of
// the node's local prefixes overlapping it (plan.Correction sets one of the two).
func correctionText(c plan.Correction) string {
	what := fmt.Sprintf("contained tunnel endpoint %v", c.Endpoint)
	if c.Local.IsValid() {
		what = fmt.Sprintf("overlapped local prefix %v", c.Local)
	}
	return fmt.Sprintf("route %v (%s) %s: replaced by %v", c.Removed, c.Origin, what, c.Kept)
}

// Start loads and attaches the datapath and does the first full sync: plan, the
// config entry (written before any program is attached), isthmus0, the program
// links, the maps and the routes. It writes cfg.ReadyFile when done. A pin
// directory from an earlier run is reused: maps keep their contents and links are
// updated in place to the new programs.
func Start(cfg Config) (*Agent, error) { return start(context.Background(), cfg, false) }

// start is Start; with wait, a node that cannot be planned yet (its Node in no
// Site, or set aside) makes it wait for the objects to change, reporting why,
// instead of failing: an agent scheduled before its Site exists must not
// crash-loop.
func start(ctx context.Context, cfg Config, wait bool) (*Agent, error) {
	if cfg.PinDir == "" {
		cfg.PinDir = datapath.DefaultPinDir
	}
	if cfg.Decap == "" {
		cfg.Decap = datapath.DecapAuto
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = source.DefaultDebounce
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Planner == nil {
		cfg.Planner = CachedPlanner(plan.NewCache())
	}
	if cfg.HealthPort == 0 {
		cfg.HealthPort = health.DefaultPort
	}
	if cfg.SNATPortMin == 0 && cfg.SNATPortMax == 0 {
		cfg.SNATPortMin, cfg.SNATPortMax = DefaultSNATPortMin, DefaultSNATPortMax
	}
	if cfg.SNATPortMin == 0 || cfg.SNATPortMin > cfg.SNATPortMax {
		return nil, fmt.Errorf("start agent: SNAT port range %d-%d is empty", cfg.SNATPortMin, cfg.SNATPortMax)
	}
	if cfg.Node == "" {
		return nil, errors.New("start agent: node is required")
	}
	if (cfg.ObjectsDir == "") == (cfg.Source == nil) {
		return nil, errors.New("start agent: want exactly one object source, an objects dir or a Source")
	}
	if cfg.Status == nil {
		cfg.Status = NewStatus()
	}
	cfg.WireGuard.defaults()
	a := &Agent{cfg: cfg, log: cfg.Log.With("node", cfg.Node), pods: map[string]int{}, src: cfg.Source, st: cfg.Status,
		reported: map[string]map[string]bool{}}
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()
	if a.src == nil {
		// Watch before the first read, so no change falls between the two.
		f, err := source.NewFiles(cfg.ObjectsDir, cfg.Rules, cfg.Debounce, a.log)
		if err != nil {
			return nil, err
		}
		a.src, a.ownSrc = f, true
	}

	p, warns, err := a.load()
	for wait && err != nil {
		if p, warns, err = a.waitForPlan(ctx, err); ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	a.st.loaded(err)
	if err != nil {
		return nil, err
	}
	a.plan = p
	a.logWarnings("load", warns)

	if a.underlay, err = datapath.FindUnderlay(cfg.UnderlayDev, p.Underlay); err != nil {
		return nil, err
	}
	// The maps that grow with the fleet are sized from the plan.
	sized, _ := mapstate.FromPlan(p, mapstate.NodeConfig{})
	tables, err := tablesFor(sized)
	if err != nil {
		return nil, err
	}
	if a.dp, err = datapath.Load(cfg.PinDir, datapath.Options{NatEntries: cfg.NatEntries, NatSourceFlows: cfg.NatSourceFlows, Tables: tables, Log: a.log}); err != nil {
		return nil, err
	}
	// Drops after a redirect are counted only with the tracer; the datapath runs
	// without it (no kernel BTF), and isthmus_datapath_redirect_drop_tracer says so.
	if err := a.dp.AttachTracer(); err != nil {
		a.log.Warn("kfree_skb tracer not attached: packets the kernel drops after a redirect are not counted", "err", err)
	}
	if err := datapath.EnableForwarding(); err != nil {
		return nil, err
	}
	if err := a.ensureOverlay(); err != nil {
		return nil, err
	}
	if cfg.WireGuard.StateDir != "" {
		if err := a.loadWireGuardKey(); err != nil {
			return nil, err
		}
	}
	// Before the config entry: a restarted agent adopts the device and writes
	// its ifindex again, so encrypted traffic never finds it missing. A
	// userspace device another container runs may not be up yet: until it is,
	// what is for encrypted peers is dropped (no device), and its link's
	// appearance brings a sync.
	if err := a.reportWireGuardWaiting(a.ensureWireGuard()); err != nil {
		return nil, err
	}
	if err := a.ensureMasqueradeExemption(); err != nil {
		return nil, err
	}
	// The config entry first: the programs read it for every packet.
	cur, err := a.dp.Maps.Read()
	if err != nil {
		return nil, err
	}
	want := cur.Clone()
	want.Config = a.desired(cur).Config
	if _, err := maps.Apply(a.dp.Maps, maps.Diff(cur, want)); err != nil {
		return nil, fmt.Errorf("write config: %w", err)
	}

	if _, err := datapath.Attach(cfg.PinDir, datapath.HookOverlayEgress, a.dp.Program(datapath.HookOverlayEgress), datapath.OverlayDev, a.overlay.Ifindex); err != nil {
		return nil, err
	}
	if a.xdp, err = datapath.AttachUnderlay(a.dp, a.underlay, cfg.Decap, a.log); err != nil {
		return nil, err
	}
	if err := a.scanPods(); err != nil {
		return nil, err
	}
	a.st.podsErr(nil)
	if err := a.pruneLinks(); err != nil {
		return nil, err
	}
	if err := a.sync("start", false); err != nil {
		return nil, err
	}
	if cfg.ReadyFile != "" {
		if err := os.WriteFile(cfg.ReadyFile, []byte("ready\n"), 0o644); err != nil {
			return nil, fmt.Errorf("write ready file: %w", err)
		}
	}
	a.st.setAttached()
	a.log.Info("agent ready", "underlay", a.underlay.Attrs().Name, "xdp", a.xdp,
		"overlay_mtu", a.overlay.MTU, "pods", len(a.pods), "pin_dir", cfg.PinDir)
	ok = true
	return a, nil
}

// load reads a snapshot of the objects and computes the plan, with the
// warnings of both. Objects set aside are reported (see reportRejected); only
// a failure to plan this node is an error.
func (a *Agent) load() (*plan.NodePlan, []string, error) {
	a.loaded = false
	gens, counted := a.src.(source.Generations)
	var gen uint64
	if counted {
		gen = gens.Generation() // before the snapshot: a change during it reloads next time
	}
	var since time.Time
	if times, ok := a.src.(source.ChangeTimes); ok {
		since = times.TakeSince() // before the snapshot too: the snapshot holds that change
	}
	set, owarns, err := a.src.Snapshot()
	if err != nil {
		return nil, nil, err
	}
	defer func() { a.loadedGen, a.loaded = gen, counted && a.loaded }()
	a.reportRejected(set.Rejected)
	var out []string
	for _, w := range owarns {
		out = append(out, w.String())
	}
	if err := Plannable(set, owarns, a.cfg.Node); err != nil {
		return nil, out, err
	}
	p, warns, err := a.cfg.Planner(set, a.cfg.Node)
	if err != nil {
		return nil, out, err
	}
	a.loaded = true
	// A change that left this node unplannable never reaches the maps and
	// is not timed; one whose plan was not written yet keeps its time.
	if a.changedSince.IsZero() {
		a.changedSince = since
	}
	return p, append(out, warns...), nil
}

// Plannable returns why node cannot be planned from set (read with warns
// from a Source: objects set aside in set.Rejected, Nodes left out named in
// warns), or nil. Objects of other nodes set aside do not stop this one. It
// is the check the agent makes before planning, and what `isthmus plan`
// makes too, so both stop on the same objects for the same reasons.
func Plannable(set *objects.Set, warns []objects.Warning, node string) error {
	self := objects.Label("Node", node)
	if r := set.Rejection(self); r != nil {
		return fmt.Errorf("this node's Node is set aside: %s", r)
	}
	if set.Node(node) == nil {
		// The Kubernetes source leaves out nodes in no Site with a warning
		// that says why; say it again here, where it stops this node.
		for _, w := range warns {
			if w.Object == self {
				return fmt.Errorf("this node is not planned: %s", w)
			}
		}
	}
	return nil
}

// unchanged reports whether the source saw no change since the last
// successful load, so a periodic resync can keep the plan and only compare
// the kernel with it.
func (a *Agent) unchanged() bool {
	gens, ok := a.src.(source.Generations)
	return ok && a.loaded && gens.Generation() == a.loadedGen
}

// waitForPlan waits for the objects to change (or the resync period) after a
// load failed with err, keeping the liveness heartbeat, and loads again. The
// reason is logged when it changes and shows in /readyz.
func (a *Agent) waitForPlan(ctx context.Context, err error) (*plan.NodePlan, []string, error) {
	a.st.loaded(err)
	a.reportChanged("wait", []string{err.Error()}, func(line string) {
		a.log.Error("waiting: this node cannot be planned yet", "err", line)
	})
	retry := time.NewTimer(a.cfg.Resync)
	defer retry.Stop()
	beat := time.NewTicker(heartbeat)
	defer beat.Stop()
	for {
		a.st.turned()
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-beat.C:
			continue
		case <-a.src.Changed():
		case <-retry.C:
		}
		return a.load()
	}
}

// reportRejected logs the objects set aside when the set of them changed, and
// records their number in the metrics.
func (a *Agent) reportRejected(rs []objects.Rejected) {
	lines := make([]string, 0, len(rs))
	byKind := map[string]int{}
	for _, r := range rs {
		lines = append(lines, r.String())
		kind, _, ok := r.KindName()
		if !ok {
			kind = "unnamed"
		}
		byKind[kind]++
	}
	a.cfg.Metrics.Rejected(byKind)
	a.reportChanged("rejected", lines, func(line string) {
		a.log.Warn("object set aside; everything else is planned", "reason", line)
	})
}

// reportChanged logs each of lines that group did not hold the last time, and
// makes lines the group's new contents: a problem is logged when it appears,
// not on every resync that still finds it.
func (a *Agent) reportChanged(group string, lines []string, log func(string)) {
	now := make(map[string]bool, len(lines))
	for _, l := range lines {
		if !a.reported[group][l] && !now[l] {
			log(l)
		}
		now[l] = true
	}
	a.reported[group] = now
}

// Close releases the agent's handles and stops its health checks and the
// source it opened; the datapath stays attached and pinned (the groups keep
// the last slots written).
func (a *Agent) Close() {
	if a.ownSrc && a.src != nil {
		if err := a.src.Close(); err != nil {
			a.log.Error("close object source", "err", err)
		}
		a.src = nil
	}
	if a.health != nil {
		a.health.Close()
		a.health = nil
		a.st.setChecker(nil)
	}
	if a.dp != nil {
		a.dp.Close()
		a.dp = nil
	}
	if a.wg.keyWatch != nil {
		a.wg.keyWatch.Close()
		a.wg.keyWatch = nil
	}
	if a.wg.dev != nil {
		// Only the handles: the device, its sessions and the userspace process
		// outlive the agent.
		a.wg.dev.Close()
		a.wg.dev = nil
	}
}

// PodInterfaces returns the names of the attached pod interfaces, sorted.
func (a *Agent) PodInterfaces() []string {
	var out []string
	for n := range a.pods {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Run follows the object source and the interfaces until ctx is done.
func (a *Agent) Run(ctx context.Context) error {
	links := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) {
			if ctx.Err() == nil { // closing the subscription on exit is not an error
				a.log.Error("link updates", "err", err)
			}
		},
	}); err != nil {
		return fmt.Errorf("subscribe to link updates: %w", err)
	}
	// Address changes may move this node's InternalIP to another device: the
	// underlay is resolved again (see ensureUnderlay).
	addrs := make(chan netlink.AddrUpdate, 64)
	if err := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{
		ErrorCallback: func(err error) {
			if ctx.Err() == nil {
				a.log.Error("address updates", "err", err)
			}
		},
	}); err != nil {
		return fmt.Errorf("subscribe to address updates: %w", err)
	}
	// Policy rules decide whether the fast path's FIB lookups may skip them.
	rules := make(chan struct{}, 1)
	if err := datapath.RuleSubscribe(rules, done, func(err error) {
		if ctx.Err() == nil {
			a.log.Error("policy rule updates", "err", err)
		}
	}); err != nil {
		return err
	}
	a.ruleWatch = true
	defer func() { a.ruleWatch = false }()
	// Interfaces that appeared between Start and the subscription.
	a.scanPodsLogged()
	a.syncLogged("pods", false)

	resync := time.NewTicker(a.cfg.Resync)
	defer resync.Stop()
	beat := time.NewTicker(heartbeat)
	defer beat.Stop()
	collect := time.NewTicker(natCollectInterval)
	defer collect.Stop()
	for {
		if a.resize != nil {
			return a.resize
		}
		a.st.turned()
		select {
		case <-beat.C:
			if a.wg.keyWatch == nil { // else the watch reports a rotation
				a.checkWireGuardKey()
			}
		case ev := <-a.keyEvents():
			if a.isKeyFile(ev) {
				a.checkWireGuardKey()
			}
		case <-ctx.Done():
			a.log.Info("agent stopping; datapath stays in place")
			return nil
		case down := <-a.healthChanges():
			a.down = down
			a.syncLogged("health", false)
		case <-a.src.Changed():
			a.syncLogged("objects", true)
		case u, ok := <-links:
			if !ok {
				a.log.Error("link updates stopped; relying on the periodic resync")
				links = nil
				continue
			}
			if a.handleLink(u) {
				a.scanPodsLogged() // clears an earlier attach failure once all are attached
				a.syncLogged("pods", false)
			} else if a.underlayMayHaveMoved(u) {
				a.syncLogged("underlay", false)
			} else if a.isWireGuardLink(u) {
				a.syncLogged("wireguard", false)
			}
		case u, ok := <-addrs:
			if !ok {
				a.log.Error("address updates stopped; relying on the periodic resync")
				addrs = nil
				continue
			}
			if u.LinkAddress.IP.Equal(a.plan.Underlay.AsSlice()) {
				a.syncLogged("underlay", false)
			}
		case _, ok := <-rules:
			if !ok {
				a.log.Error("policy rule updates stopped; FIB lookups walk the rules")
				rules = nil
				a.ruleWatchLost = true
			}
			a.syncLogged("rules", false)
		case <-resync.C:
			a.scanPodsLogged()
			a.syncLogged("resync", true)
		case <-collect.C:
			a.collectNat()
		}
	}
}

// natCollectInterval is how often the agent removes expired entries from the nat
// tables: well under their shortest timeout (10 s for a closed TCP flow), so a pod's
// share frees within seconds of its flows' expiry.
const natCollectInterval = 5 * time.Second

// collectNat removes the expired entries of nat and masq_nat and recounts each pod
// source's flows (maps.CollectNat); a failure is logged and retried next time.
func (a *Agent) collectNat() {
	now, err := maps.MonotonicNow()
	if err != nil {
		a.log.Error("collect nat tables", "err", err)
		return
	}
	sources := a.dp.Maps.Map(maps.MapNatSources)
	for _, t := range []struct {
		name  maps.Name
		table uint32
	}{{maps.MapNat, maps.NatTableSNAT}, {maps.MapMasqNat, maps.NatTableMasq}} {
		res, err := maps.CollectNat(a.dp.Maps.Map(t.name), sources, t.table, now)
		if err != nil {
			a.log.Error("collect nat table", "map", t.name, "err", err)
			continue
		}
		if res.Deleted > 0 {
			a.log.Debug("nat table collected", "map", t.name, "expired", res.Deleted, "sources", len(res.Live))
		}
	}
}

// scanPodsLogged scans the pod interfaces; a failure is logged and keeps the
// agent not ready until a scan attaches them all.
func (a *Agent) scanPodsLogged() {
	err := a.scanPods()
	if err != nil {
		a.log.Error("scan pod interfaces", "err", err)
	}
	a.st.podsErr(err)
}

func (a *Agent) syncLogged(reason string, reload bool) {
	if err := a.sync(reason, reload); err != nil {
		a.log.Error("sync", "reason", reason, "err", err)
	}
}

// sync reads the objects (if reload) and brings isthmus0, the maps, the routes
// and the masquerade exemption, in that order, to the plan. A plan that fails to load leaves the last good one in force. It
// records its result in the Status and the sync metrics.
func (a *Agent) sync(reason string, reload bool) (err error) {
	start := time.Now()
	written := 0
	defer func() {
		end := time.Now()
		a.cfg.Metrics.Observe(end.Sub(start), written, end, err)
		a.st.synced(err)
	}()
	reused := reload && reason == "resync" && a.unchanged()
	if reused {
		reload = false // nothing changed: compare the kernel with the plan we have
	}
	if reload {
		p, warns, err := a.load()
		a.st.loaded(err)
		if err != nil {
			a.reportChanged("load-error", []string{err.Error()}, func(line string) {
				a.log.Error("this node cannot be planned; keeping the last good state", "err", line)
			})
		} else {
			a.reportChanged("load-error", nil, nil)
			a.plan = p
			a.logWarnings("load", warns)
		}
	}
	if err := a.ensureUnderlay(); err != nil {
		return err
	}
	before := a.overlay.Ifindex
	if err := a.ensureOverlay(); err != nil {
		return err
	}
	if a.overlay.Ifindex != before {
		if _, err := datapath.Attach(a.cfg.PinDir, datapath.HookOverlayEgress, a.dp.Program(datapath.HookOverlayEgress), datapath.OverlayDev, a.overlay.Ifindex); err != nil {
			return err
		}
	}
	// The rest of the datapath does not wait for a userspace device that
	// another container has not started yet (encrypted peers' traffic is
	// dropped meanwhile, config.wg_ifindex 0).
	if err := a.reportWireGuardWaiting(a.ensureWireGuard()); err != nil {
		return err
	}
	a.publishWireGuardKey()
	a.ensureHealth()
	current, err := a.dp.Maps.Read()
	if err != nil {
		return err
	}
	desired := a.desired(current)
	if err := a.dp.Maps.CheckCapacity(desired); err != nil {
		// Writing would stop part way, with routes missing: grow the maps
		// first. If that fails, Run exits on this error, and the agent
		// started again sizes the maps from the plan.
		if gerr := a.growMaps(desired, err); gerr != nil {
			a.resize = fmt.Errorf("%w (and growing them in place failed: %v)", err, gerr)
			return fmt.Errorf("the fleet outgrew the maps; exiting to resize them: %w", a.resize)
		}
		if current, err = a.dp.Maps.Read(); err != nil {
			return err
		}
		desired = a.desired(current)
	}
	res, err := maps.Apply(a.dp.Maps, maps.Diff(current, desired))
	written = res.Updated + res.Deleted // what was written before a failure too
	if err != nil {
		return err
	}
	if !a.changedSince.IsZero() {
		a.cfg.Metrics.EventToMaps(time.Since(a.changedSince))
		a.changedSince = time.Time{}
	}
	main, pods := a.routes()
	if err := a.ensureIPv6Forwarding(main, pods); err != nil {
		return err
	}
	rres, err := datapath.SyncRoutes(datapath.KernelRoutes{}, main)
	if err != nil {
		return err
	}
	// The pods' table before their rules: a rule never points at routes
	// still missing.
	pres, err := datapath.SyncRoutes(datapath.KernelRoutes{Table: datapath.PodTable}, pods)
	if err != nil {
		return err
	}
	if _, err := datapath.SyncRules(datapath.KernelRules{}, a.plan.TunnelSources); err != nil {
		return err
	}
	fres, err := datapath.SyncRoutes(datapath.KernelRoutes{Table: datapath.FabricTable}, a.fabricRoutes())
	if err != nil {
		return err
	}
	fabricRules := datapath.KernelRules{Table: datapath.FabricTable, Priority: datapath.FabricRulePriority}
	if _, err := datapath.SyncRules(fabricRules, a.plan.FabricEgress); err != nil {
		return err
	}
	pres.Replaced, pres.Deleted = pres.Replaced+fres.Replaced, pres.Deleted+fres.Deleted
	if err := a.ensureMasqueradeExemption(); err != nil {
		return err
	}
	rres.Replaced, rres.Deleted = rres.Replaced+pres.Replaced, rres.Deleted+pres.Deleted
	a.log.Info("synced", "reason", reason, "entries_written", res.Updated+res.Deleted,
		"updated", res.Updated, "deleted", res.Deleted,
		"routes_replaced", rres.Replaced, "routes_deleted", rres.Deleted, "plan_reused", reused,
		"pods", len(a.pods), "duration", time.Since(start).Round(time.Microsecond))
	for _, c := range res.Applied {
		a.log.Debug("map write", "change", c.String())
	}
	return nil
}

// tablesFor sizes the maps that grow with the fleet (a variable so that a test
// can start with maps the fleet outgrows at once).
var tablesFor = datapath.TablesFor

// growMaps resizes, in place, the maps that the plan outgrew (why): Load
// migrates them as at a start (new maps sized for desired, entries copied,
// every pinned link switched to programs that use them, no packet meets a
// program without its maps) and the agent goes on with the new collection.
// Every agent of a fleet that doubled does this at about the same time; a
// restart would have made each of them list the objects again.
func (a *Agent) growMaps(desired maps.State, why error) error {
	tables, err := tablesFor(desired)
	if err != nil {
		return err
	}
	a.log.Warn("the fleet outgrew the maps: growing them in place", "why", why,
		"routes", tables.Routes, "peers", tables.Peers, "peer_sources", tables.PeerSources)
	dp, err := datapath.Load(a.cfg.PinDir, datapath.Options{NatEntries: a.cfg.NatEntries, NatSourceFlows: a.cfg.NatSourceFlows, Tables: tables, Log: a.log})
	if err != nil {
		return err
	}
	old := a.dp
	a.dp = dp
	old.Close()
	// The tracer reads redirect_last and writes redirect_drops, which were
	// not migrated; attaching it from the new collection keeps it current.
	if err := a.dp.AttachTracer(); err != nil {
		a.log.Warn("kfree_skb tracer not attached again after growing the maps", "err", err)
	}
	return nil
}

// underlayMayHaveMoved reports whether a link update touches the underlay
// device (it went away, was renamed, or a device with the configured name
// came back): the next sync resolves it again.
func (a *Agent) underlayMayHaveMoved(u netlink.LinkUpdate) bool {
	cur := a.underlay.Attrs()
	return int(u.Index) == cur.Index || u.Attrs().Name == cur.Name ||
		(a.cfg.UnderlayDev != "" && u.Attrs().Name == a.cfg.UnderlayDev)
}

// ensureUnderlay resolves the underlay device again (the configured one, or
// the one holding this node's InternalIP, which may have moved to another
// device or come back under a new ifindex) and, when it is another device
// than the one the datapath is attached to, attaches there and removes the
// old links. The config entry (its ifindex) follows in the same sync.
func (a *Agent) ensureUnderlay() error {
	l, err := datapath.FindUnderlay(a.cfg.UnderlayDev, a.plan.Underlay)
	if err != nil {
		return err
	}
	old := a.underlay.Attrs()
	if l.Attrs().Index == old.Index && l.Attrs().Name == old.Name {
		a.underlay = l // fresh attributes (MTU) for the overlay
		return nil
	}
	xdp, err := datapath.AttachUnderlay(a.dp, l, a.cfg.Decap, a.log)
	if err != nil {
		return err
	}
	a.underlay, a.xdp = l, xdp
	a.log.Info("underlay moved", "from", old.Name, "from_ifindex", old.Index,
		"to", l.Attrs().Name, "to_ifindex", l.Attrs().Index, "xdp", xdp)
	return a.pruneLinks()
}

// desired computes the maps' desired state; current (what the kernel holds) keeps
// next-hop group ids where they are.
func (a *Agent) desired(current maps.State) maps.State {
	node := mapstate.NodeConfig{
		VNI:              a.cfg.VNI,
		UnderlayIfindex:  a.underlay.Attrs().Index,
		OverlayIfindex:   a.overlay.Ifindex,
		OverlayMAC:       a.overlay.MAC,
		TunnelMTU:        a.overlay.MTU,
		SNATPortMin:      a.cfg.SNATPortMin,
		SNATPortMax:      a.cfg.SNATPortMax,
		Down:             a.down,
		CurrentGroups:    map[netip.Prefix]uint32{},
		WireGuardIfindex: a.wg.ifindex,
		CurrentHandles:   current.Handles,
	}
	for p, r := range current.Routes {
		if r.Group != 0 {
			node.CurrentGroups[p] = r.Group
		}
	}
	for _, i := range a.pods {
		node.PodIfindexes = append(node.PodIfindexes, i)
		if a.podNoPeer[i] {
			node.PodNoPeer = append(node.PodNoPeer, i)
		}
	}
	node.PodAddrs = a.podAddrs()
	s, warns := mapstate.FromPlan(a.plan, node)
	a.logWarnings("maps", warns)
	// CFG_F_TRACE belongs to a running `isthmus trace`: keep what the kernel holds.
	s.Config.Flags |= current.Config.Flags & maps.ConfigFlagTrace
	if a.directFIB() {
		s.Config.Flags |= maps.ConfigFlagFIBDirect
	}
	return s
}

// directFIB reports whether the fast path's FIB lookups may go straight to the
// main table (datapath.DirectFIB), and logs when that changes. Without a watch on
// the rules (it failed, or Run has not started it) they always walk the rules: a
// rule added later would go unseen.
func (a *Agent) directFIB() bool {
	ok, why, err := false, "policy rules are not watched", error(nil)
	if a.ruleWatch && !a.ruleWatchLost {
		ok, why, err = datapath.DirectFIB(a.plan.Underlay)
		if err != nil {
			ok, why = false, err.Error()
		}
	}
	if ok != a.fibDirect || (!ok && why != a.fibDirectWhy) {
		if ok {
			a.log.Info("fast-path FIB lookups go to the main table: the policy rules are the kernel's and isthmus'")
		} else {
			a.log.Info("fast-path FIB lookups walk the policy rules", "why", why)
		}
	}
	a.fibDirect, a.fibDirectWhy = ok, why
	return ok
}

// podAddrs returns the CNI plugin's reservations of the attached pod
// interfaces. A store it cannot read gives none: those interfaces then fall
// back to the datapath's FIB check, which still refuses a neighbour's address.
func (a *Agent) podAddrs() []maps.PodAddr {
	if a.cfg.IPAMDir == "" {
		return nil
	}
	rs, err := ipam.Store{Dir: a.cfg.IPAMDir}.List()
	if err != nil {
		a.log.Error("read the CNI reservations; pod sources fall back to the FIB check", "dir", a.cfg.IPAMDir, "err", err)
		return nil
	}
	var out []maps.PodAddr
	for _, r := range rs {
		if i, ok := a.pods[r.HostIface]; ok && r.HostIface != "" {
			out = append(out, maps.PodAddr{Ifindex: uint32(i), Addr: r.Addr})
		}
	}
	return out
}

// routes returns the plan's routes for the main table and for the pods' table
// (datapath.PodTable): TransitOnly routes are for forwarded traffic only, and
// the kernel forwards only the pods' (plan.NodePlan.TunnelSources) there.
// Every route's source is the tunnel address but an UnderlaySource one's, the
// node's InternalIP. An
// Underlay route (an exception inside a TransitOnly one) is a throw route
// there, so the pods' lookup goes on to main and the underlay.
// With a tunnel MTU below minIPv6MTU there are no IPv6 routes: the kernel has
// no IPv6 on isthmus0 then, and one refused route would fail the whole sync
// (ipv6Carried says why, once).
func (a *Agent) routes() (main, pods []datapath.Route) {
	var mainPrefixes, underlaySourced, podPrefixes, throws []netip.Prefix
	v6 := a.ipv6Carried()
	for _, r := range a.plan.Routes {
		if !v6 && !r.Prefix.Addr().Is4() {
			continue
		}
		switch {
		case r.Underlay:
			throws = append(throws, r.Prefix)
		case r.TransitOnly:
			if !r.NotForPods {
				podPrefixes = append(podPrefixes, r.Prefix)
			}
		case r.UnderlaySource:
			underlaySourced = append(underlaySourced, r.Prefix)
		default:
			mainPrefixes = append(mainPrefixes, r.Prefix)
		}
	}
	main = datapath.OverlayRoutes(mainPrefixes, a.overlay.Ifindex, a.plan.TunnelAddr)
	main = append(main, datapath.OverlayRoutes(underlaySourced, a.overlay.Ifindex, a.plan.Underlay)...)
	if len(a.plan.TunnelSources) == 0 {
		return main, nil // no rule leads to the pods' table
	}
	return main, append(datapath.OverlayRoutes(podPrefixes, a.overlay.Ifindex, a.plan.TunnelAddr), datapath.ThrowRoutes(throws)...)
}

// ipv6Carried reports whether isthmus0's MTU carries IPv6 (at least
// minIPv6MTU), and logs once per MTU, as an error, when the plan has IPv6 routes
// it then leaves out: those pods cannot be reached across sites until the tunnel
// MTU (the Site's tunnelMTU, or the underlay's MTU less the encapsulation) is
// raised.
func (a *Agent) ipv6Carried() bool {
	if a.overlay.MTU >= minIPv6MTU || a.overlay.MTU == 0 {
		return true
	}
	if a.ipv6MTUWarned != a.overlay.MTU && slices.ContainsFunc(a.plan.Routes, func(r plan.Route) bool { return !r.Prefix.Addr().Is4() }) {
		a.ipv6MTUWarned = a.overlay.MTU
		a.log.Error("the tunnel MTU is below IPv6's minimum: IPv6 pods of other nodes are not routed into the tunnel",
			"tunnel_mtu", a.overlay.MTU, "ipv6_min_mtu", minIPv6MTU)
	}
	return false
}

// ensureIPv6Forwarding turns on IPv6 forwarding (datapath.EnableIPv6Forwarding)
// the first time the node has IPv6 pods (a podCIDR among the plan's
// TunnelSources) or routes, or its underlay is IPv6 (the datapath's FIB lookups
// toward IPv6 peers are forwarding lookups): not before, so a node of an
// IPv4-only cluster keeps the IPv6 settings it has.
func (a *Agent) ensureIPv6Forwarding(routes ...[]datapath.Route) error {
	if a.ipv6Forwarding {
		return nil
	}
	v6 := a.plan.Underlay.Unmap().Is6() ||
		slices.ContainsFunc(a.plan.TunnelSources, func(p netip.Prefix) bool { return !p.Addr().Unmap().Is4() })
	for _, rs := range routes {
		v6 = v6 || slices.ContainsFunc(rs, func(r datapath.Route) bool { return !r.Prefix.Addr().Is4() })
	}
	if !v6 {
		return nil
	}
	if err := datapath.EnableIPv6Forwarding(); err != nil {
		return err
	}
	a.ipv6Forwarding = true
	a.log.Info("IPv6 forwarding on: the node has IPv6 pods or routes, or an IPv6 underlay")
	return nil
}

// fabricRoutes returns the plan's ViaFabric routes for datapath.FabricTable:
// each through its gateways on the underlay device, with the tunnel MTU
// (what leaves there is encapsulated on the way out). The kernel's choice
// among several gateways only picks a neighbour; the datapath picks the
// gateway the packet is tunnelled to, by the route's next-hop group, live
// members only. Every other route inside a ViaFabric one (a peer's own
// address, an Underlay exception) is a throw route there: the datapath's
// lookup takes the longest route, so the kernel's must go on to the pods'
// table and main for it.
func (a *Agent) fabricRoutes() []datapath.Route {
	if len(a.plan.FabricEgress) == 0 {
		return nil
	}
	var prefixes, fabric, throws []netip.Prefix
	var gateways [][]netip.Addr
	for _, r := range a.plan.Routes {
		if !r.ViaFabric {
			continue
		}
		var via []netip.Addr
		for _, m := range r.Group {
			via = append(via, m.Via)
		}
		prefixes, gateways = append(prefixes, r.Prefix), append(gateways, via)
		fabric = append(fabric, r.Prefix)
	}
	for _, r := range a.plan.Routes {
		if r.ViaFabric {
			continue
		}
		if slices.ContainsFunc(fabric, func(f netip.Prefix) bool { return f.Bits() < r.Prefix.Bits() && f.Contains(r.Prefix.Addr()) }) {
			throws = append(throws, r.Prefix)
		}
	}
	return append(datapath.FabricRoutes(prefixes, gateways, a.underlay.Attrs().Index, a.overlay.MTU), datapath.ThrowRoutes(throws)...)
}

// ensureHealth runs the health checks from the plan's tunnel address (restarting
// them when it changed) and hands them the plan's group members. Without a tunnel
// address, or when the sockets cannot be opened (logged; retried on the next
// sync), there are none and every member counts as up.
func (a *Agent) ensureHealth() {
	addr := a.plan.TunnelAddr.Unmap()
	if a.health != nil && a.healthAddr != addr {
		a.health.Close()
		a.health, a.down = nil, nil
		a.st.setChecker(nil)
	}
	targets, warns := health.Targets(a.plan)
	if a.health == nil {
		if !addr.Is4() {
			if len(targets) > 0 {
				a.log.Warn("no tunnel address: next-hop group members are not health-checked")
			}
			return
		}
		c, err := health.Start(health.Config{
			Addr: addr, Port: a.cfg.HealthPort, Interval: a.cfg.HealthInterval,
			Multiplier: a.cfg.HealthMultiplier, Rise: a.cfg.HealthRise,
			Datapath: maps.HealthResponderOf(a.dp.Maps), ReachExpiry: a.cfg.HealthReachExpiry,
			Log: a.log,
		})
		if err != nil {
			a.log.Error("health checks not running; every group member counts as up", "err", err)
			return
		}
		a.health, a.healthAddr = c, addr
		a.st.setChecker(c)
		a.log.Info("health checks started", "addr", addr, "port", c.Port())
	}
	a.logWarnings("health", warns)
	a.health.SetTargets(targets)
	a.down = a.health.Down()
}

// healthChanges is the channel of down-set changes, nil (never ready) without
// health checks.
func (a *Agent) healthChanges() <-chan map[maps.GroupMember]bool {
	if a.health == nil {
		return nil
	}
	return a.health.Changes()
}

func (a *Agent) ensureOverlay() error {
	mtu := datapath.TunnelMTU(a.underlay.Attrs().MTU, a.plan.TunnelMTU, a.plan.TunnelOverhead)
	ov, err := datapath.EnsureOverlay(mtu, a.plan.TunnelAddr)
	if err != nil {
		return err
	}
	a.overlay = ov
	return nil
}

// ensureMasqueradeExemption keeps overlay traffic out of other CNIs'
// MASQUERADE rules: the datapath hands pod traffic to the stack, and no
// rule there may rewrite it (datapath.EnsureMasqueradeExemption). Start
// installs it before any program is attached; every sync then repairs it
// after the maps and routes, since it runs iptables and nft, tens of
// milliseconds on a busy node that a change would otherwise wait for before
// reaching the maps (isthmus_event_to_maps_seconds).
//
// The host's own traffic from its tunnel address keeps that address too where
// the fabric rule sends it to the underlay device (the tunnel address lies in
// FabricEgress: a bridge CNI's gateway address), so its answers come back to it.
//
// With it go the flow marks (datapath.EnsureFlowMarks): a flow that entered the
// node for a local address (a NodePort DNATed to a local pod) is answered on
// the device it came in on, whatever the pods' rules say.
func (a *Agent) ensureMasqueradeExemption() error {
	ex := datapath.Exemption{Underlay: a.underlay.Attrs().Name}
	if t := a.plan.TunnelAddr; t.IsValid() && slices.ContainsFunc(a.plan.FabricEgress, func(p netip.Prefix) bool { return p.Contains(t) }) {
		ex.FabricHost = t
	}
	if err := datapath.EnsureMasqueradeExemption(ex); err != nil {
		return err
	}
	return datapath.EnsureFlowMarks(a.underlay.Attrs().Name)
}

// logWarnings logs the warnings of group that are new since its last call.
func (a *Agent) logWarnings(group string, warns []string) {
	a.reportChanged(group, warns, func(w string) { a.log.Warn("plan", "warning", w) })
}

// isPod reports whether an interface called name is a pod interface to attach to.
func (a *Agent) isPod(name string) bool {
	if name == datapath.OverlayDev || name == datapath.OverlayPeerDev || name == a.underlay.Attrs().Name {
		return false
	}
	return MatchAny(a.cfg.PodPatterns, name)
}

// scanPods attaches every matching interface not yet attached and forgets attached
// ones that are gone.
func (a *Agent) scanPods() error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list interfaces: %w", err)
	}
	seen := map[string]bool{}
	var errs []error
	for _, l := range links {
		name := l.Attrs().Name
		if !a.isPod(name) {
			continue
		}
		seen[name] = true
		if err := a.attachPod(name, l.Attrs().Index); err != nil {
			errs = append(errs, err)
		}
	}
	for name := range a.pods {
		if !seen[name] {
			a.forgetPod(name)
		}
	}
	return errors.Join(errs...)
}

func (a *Agent) attachPod(name string, ifindex int) error {
	if a.pods[name] == ifindex {
		return nil
	}
	// pod_ifaces first: once pod_ingress runs on the interface, the pod's first
	// flows are redirected past the stack, and replies delivered before the
	// next sync lists the interface would go through a stack that never saw the
	// requests (conntrack INVALID, dropped by the site's rules). The sync that
	// follows keeps this entry, with its flags.
	var flags uint32
	if !hasPeer(ifindex) {
		flags = maps.PodIfaceFlagNoPeer
	}
	var cur maps.PodIfaceValue
	if err := a.dp.Maps.Map(maps.MapPodIfaces).Lookup(uint32(ifindex), &cur); err != nil || cur.Flags&maps.PodIfaceFlagNoPeer != flags {
		if err := a.dp.Maps.Update(maps.MapPodIfaces, uint32(ifindex), maps.PodIfaceValue{Flags: cur.Flags&^maps.PodIfaceFlagNoPeer | flags}); err != nil {
			return fmt.Errorf("pod interface %s: list it in pod_ifaces: %w", name, err)
		}
	}
	r, err := datapath.Attach(a.cfg.PinDir, datapath.HookPodIngress, a.dp.Program(datapath.HookPodIngress), name, ifindex)
	if err != nil {
		return err
	}
	a.pods[name] = ifindex
	if a.podNoPeer == nil {
		a.podNoPeer = map[int]bool{}
	}
	a.podNoPeer[ifindex] = flags != 0
	a.log.Info("pod interface attached", "dev", name, "ifindex", ifindex, "link_id", r.LinkID, "updated", r.Updated, "peer", flags == 0)
	return nil
}

// hasPeer reports whether interface ifindex is one end of a veth or netkit
// pair, which bpf_redirect_peer can enter the other end of. A link it cannot
// read counts as one (a pod's veth, the common case).
func hasPeer(ifindex int) bool {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return true
	}
	t := l.Type()
	return t == "veth" || t == "netkit"
}

func (a *Agent) forgetPod(name string) {
	if err := datapath.Detach(a.cfg.PinDir, name, datapath.HookPodIngress); err != nil {
		a.log.Error("forget pod interface", "dev", name, "err", err)
	}
	delete(a.podNoPeer, a.pods[name])
	delete(a.pods, name)
	a.log.Info("pod interface forgotten", "dev", name)
}

// handleLink applies one link update and reports whether the pod set changed.
func (a *Agent) handleLink(u netlink.LinkUpdate) bool {
	name, index := u.Attrs().Name, int(u.Index)
	changed := false
	// A known ifindex under another name: renamed.
	for n, i := range a.pods {
		if i == index && n != name {
			a.forgetPod(n)
			changed = true
		}
	}
	switch u.Header.Type {
	case unix.RTM_DELLINK:
		if _, ok := a.pods[name]; ok && a.pods[name] == index {
			a.forgetPod(name)
			changed = true
		}
	case unix.RTM_NEWLINK:
		if !a.isPod(name) {
			return changed
		}
		if a.pods[name] != index {
			if err := a.attachPod(name, index); err != nil {
				a.log.Error("attach pod interface", "dev", name, "err", err)
				a.st.podsErr(err)
				return changed
			}
			changed = true
		}
	}
	return changed
}

// pruneLinks removes pinned links for interfaces and hooks the agent no longer
// uses: gone pod interfaces, an old underlay device, an XDP link after a switch to
// TC.
func (a *Agent) pruneLinks() error {
	ul := a.underlay.Attrs().Name
	removed, err := datapath.PruneLinks(a.cfg.PinDir, func(p datapath.PinnedLink) bool {
		switch p.Hook {
		case datapath.HookPodIngress:
			_, ok := a.pods[p.Ifname]
			return ok
		case datapath.HookOverlayEgress:
			return p.Ifname == datapath.OverlayDev
		case datapath.HookUnderlayIngress, datapath.HookUnderlayEgress:
			return p.Ifname == ul
		case datapath.HookUnderlayXDP:
			return p.Ifname == ul && a.xdp
		case datapath.HookWireGuard:
			// Kept while the device exists, encrypted peers or not: what comes
			// out of it meets the datapath's checks, never the stack.
			return p.Ifname == a.cfg.WireGuard.Device
		}
		return false
	})
	for _, p := range removed {
		a.log.Info("stale link removed", "dev", p.Ifname, "hook", p.Hook)
	}
	return err
}
