package agent

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/maps"
)

// exactTables sizes each growing map to the smallest power of two that holds
// s (at least 2): a fleet that grows by one peer outgrows them.
func exactTables(s maps.State) (datapath.Tables, error) {
	fit := func(n int) uint32 {
		size := uint32(2)
		for size < uint32(n) {
			size <<= 1
		}
		return size
	}
	c := s.Counts()
	return datapath.Tables{Routes: fit(c[maps.MapRoutes]), Peers: fit(c[maps.MapPeers]), PeerSources: fit(c[maps.MapPeerSources])}, nil
}

// TestAgentKernelGrowsMaps: when the fleet outgrows the maps sized at start,
// the running agent grows them in place, without exiting: the maps get the new
// size and hold the whole plan, the pinned links keep their ids and run the
// new programs (one program per hook, no temporary pin left), and the agent
// stays ready.
func TestAgentKernelGrowsMaps(t *testing.T) {
	e := setup(t)
	tablesFor = exactTables
	t.Cleanup(func() { tablesFor = datapath.TablesFor })
	a, err := Start(e.cfg)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(a.Close) // after the cleanup that stops Run: never close under a running agent
	peers := func() uint32 {
		ms, err := maps.OpenPinned(e.pinDir)
		if err != nil {
			t.Fatal(err)
		}
		defer ms.Close()
		return ms.Map(maps.MapPeers).MaxEntries()
	}
	if n := peers(); n != 2 {
		t.Fatalf("peers sized %d at start, want 2 (b1 alone)", n)
	}
	linkBefore, progBefore, _ := linkInfo(t, e.pinDir, "pod-a", datapath.HookPodIngress)
	stop := e.run(t, a)

	// Three more nodes in site b: four peers in a map of two.
	f, err := os.OpenFile(filepath.Join(e.objects, "objects.yaml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 4; i++ {
		fmt.Fprintf(f, "---\napiVersion: v1\nkind: Node\nmetadata: {name: b%d}\nspec: {podCIDRs: [10.20.%d.0/24]}\nstatus: {addresses: [{type: InternalIP, address: 172.16.2.%d}]}\n", i, i, 10+i)
	}
	f.Close()
	// Growing loads the datapath again (the verifier runs over every
	// program): seconds on a loaded machine. That it happens without an exit
	// is the point, not how fast.
	grew := time.Now()
	eventually(t, 30*time.Second, "b4's route in grown maps", func() bool {
		_, ok := readMaps(t, e.pinDir).Peers[netip.MustParseAddr("172.16.2.14")]
		return ok
	})
	t.Logf("grown and written %v after the objects changed", time.Since(grew).Round(time.Millisecond))
	if n := peers(); n != 4 {
		t.Errorf("peers sized %d after the fleet grew to four, want 4", n)
	}
	want := e.wantState(t, a, e.pod)
	// Run watches the policy rules, and this namespace has only the kernel's and
	// the agent's: the fast path's FIB lookups go direct.
	want.Config.Flags |= maps.ConfigFlagFIBDirect
	if got := readMaps(t, e.pinDir); !got.Equal(want) {
		t.Errorf("grown maps hold\n%+v\nwant\n%+v", got, want)
	}
	linkAfter, progAfter, _ := linkInfo(t, e.pinDir, "pod-a", datapath.HookPodIngress)
	if linkAfter != linkBefore || progAfter == progBefore {
		t.Errorf("pod-a's link %d -> %d, program %d -> %d: want the same link running a new program", linkBefore, linkAfter, progBefore, progAfter)
	}
	if n := tcxCount(t, e.pod.Attrs().Index, ebpf.AttachTCXIngress); n != 1 {
		t.Errorf("pod-a: %d tcx programs attached, want 1", n)
	}
	entries, err := os.ReadDir(e.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range entries {
		if strings.HasSuffix(d.Name(), ":migrating") {
			t.Errorf("temporary pin %s left in %s after growing", d.Name(), e.pinDir)
		}
	}
	if err := a.st.Ready(); err != nil {
		t.Errorf("not ready after growing the maps: %v", err)
	}
	if a.resize != nil {
		t.Errorf("the agent means to exit: %v", a.resize)
	}
	if err := stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
}
