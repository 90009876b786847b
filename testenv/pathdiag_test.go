package testenv

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestReadProcNetTable parses the header/value pairs of /proc/net/snmp's
// format, and the machine's own files.
func TestReadProcNetTable(t *testing.T) {
	p := filepath.Join(t.TempDir(), "snmp")
	os.WriteFile(p, []byte("Ip: Forwarding DefaultTTL InReceives\nIp: 1 64 42\nTcp: ActiveOpens ListenDrops\nTcp: 7 3\n"), 0o644)
	got := map[string]uint64{}
	if err := readProcNetTable(p, got); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"Ip.Forwarding": 1, "Ip.DefaultTTL": 64, "Ip.InReceives": 42, "Tcp.ActiveOpens": 7, "Tcp.ListenDrops": 3}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d", k, got[k], v)
		}
	}
	real := map[string]uint64{}
	for _, f := range []string{"snmp", "netstat"} {
		if err := readProcNetTable("/proc/thread-self/net/"+f, real); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := real["Tcp.ActiveOpens"]; !ok {
		t.Errorf("no Tcp.ActiveOpens in this machine's /proc/net/snmp: %d keys", len(real))
	}
	if _, ok := real["TcpExt.ListenDrops"]; !ok {
		t.Errorf("no TcpExt.ListenDrops in this machine's /proc/net/netstat: %d keys", len(real))
	}
}

// TestReadProcNetSNMP6 parses /proc/net/snmp6's one counter per line into
// the keys readProcNetTable's IPv4 ones look like, and the machine's own file.
func TestReadProcNetSNMP6(t *testing.T) {
	p := filepath.Join(t.TempDir(), "snmp6")
	os.WriteFile(p, []byte("Ip6InReceives                   \t42\nIcmp6InMsgs \t7\nIcmp6InType135 3\nUdp6InErrors 1\nUdpLite6InErrors 2\n"), 0o644)
	got := map[string]uint64{}
	if err := readProcNetSNMP6(p, got); err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"Ip6.InReceives": 42, "Icmp6.InMsgs": 7, "Icmp6.InType135": 3, "Udp6.InErrors": 1, "UdpLite6.InErrors": 2}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d", k, got[k], v)
		}
	}
	if err := readProcNetSNMP6(filepath.Join(t.TempDir(), "none"), got); err != nil {
		t.Errorf("a kernel without IPv6: %v, want no error", err)
	}
	real := map[string]uint64{}
	if err := readProcNetSNMP6("/proc/thread-self/net/snmp6", real); err != nil {
		t.Fatal(err)
	}
	if _, ok := real["Ip6.InReceives"]; !ok {
		t.Errorf("no Ip6.InReceives in this machine's /proc/net/snmp6: %d keys", len(real))
	}
}

// TestCounterSnapshotDiff reports only counters that rose, per place, in order.
func TestCounterSnapshotDiff(t *testing.T) {
	before := counterSnapshot{"node a1": {"Ip.InDiscards": 1, "TcpExt.ListenDrops": 0}, "pod p": {"Udp.InErrors": 5}}
	after := counterSnapshot{"node a1": {"Ip.InDiscards": 1, "TcpExt.ListenDrops": 2, "isthmus.tc_ingress.unknown_peer": 3}, "pod p": {"Udp.InErrors": 5}}
	got := after.diff(before)
	want := []string{"node a1: TcpExt.ListenDrops +2, isthmus.tc_ingress.unknown_peer +3"}
	if !slices.Equal(got, want) {
		t.Errorf("diff = %q, want %q", got, want)
	}
}
