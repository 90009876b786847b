package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
)

func att(i int) Reservation {
	return Reservation{Attachment: Attachment{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}}
}

// A /29 has 8 addresses: the network (.0), the node's first address (.1) and
// the broadcast (.7) are never handed out, so exactly .2 to .6 are.
func TestReserveSkipsReservedAddressesAndExhausts(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	p := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/29")}
	got := map[netip.Addr]bool{}
	for i := range 5 {
		a, err := s.Reserve(p, nil, att(i))
		if err != nil {
			t.Fatalf("reserve %d: %v", i, err)
		}
		got[a[0]] = true
	}
	for _, want := range []string{"10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5", "10.1.0.6"} {
		if !got[netip.MustParseAddr(want)] {
			t.Errorf("%s not handed out; got %v", want, got)
		}
	}
	if _, err := s.Reserve(p, nil, att(99)); !errors.Is(err, ErrExhausted) {
		t.Fatalf("sixth reserve in a /29: err %v, want ErrExhausted", err)
	}
	// Idempotent: the same attachment gets the same address back, even when full.
	again, err := s.Reserve(p, nil, att(2))
	if err != nil || len(again) != 1 {
		t.Fatalf("reserve again: %v %v", again, err)
	}
	freed, err := s.Release(att(2).Attachment)
	if err != nil || len(freed) != 1 || freed[0].Addr != again[0] {
		t.Fatalf("release: %v %v, want %v", freed, err, again[0])
	}
	if freed, err := s.Release(att(2).Attachment); err != nil || len(freed) != 0 {
		t.Fatalf("second release: %v %v, want nothing and no error", freed, err)
	}
	a, err := s.Reserve(p, nil, att(100))
	if err != nil || a[0] != again[0] {
		t.Fatalf("reserve after release: %v %v, want the freed %v", a, err, again[0])
	}
}

// A released address is not handed out again at once: allocation goes round
// the range from the last address it gave.
func TestReserveRoundRobin(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	p := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}
	first, _ := s.Reserve(p, nil, att(1))
	s.Release(att(1).Attachment)
	second, _ := s.Reserve(p, nil, att(2))
	if first[0] == second[0] {
		t.Fatalf("freed %v reused at once", first[0])
	}
	if want := netip.MustParseAddr("10.1.0.3"); second[0] != want {
		t.Fatalf("second address %v, want %v", second[0], want)
	}
}

func TestReserveDualStack(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	p := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24"), netip.MustParsePrefix("fd00:1::/64")}
	a, err := s.Reserve(p, nil, att(1))
	if err != nil || len(a) != 2 || a[0] != netip.MustParseAddr("10.1.0.2") || a[1] != netip.MustParseAddr("fd00:1::2") {
		t.Fatalf("dual-stack reserve: %v %v", a, err)
	}
	list, _ := s.List()
	if len(list) != 2 {
		t.Fatalf("list: %v", list)
	}
}

// An exhausted family reserves nothing in the other either.
func TestReserveAllOrNothing(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	p := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24"), netip.MustParsePrefix("fd00:1::/127")}
	if _, err := s.Reserve(p, nil, att(1)); !errors.Is(err, ErrExhausted) {
		t.Fatalf("err %v, want ErrExhausted", err)
	}
	if list, _ := s.List(); len(list) != 0 {
		t.Fatalf("left %v behind", list)
	}
}

// Fifty reservations at once, each through its own Store value as separate
// plugin processes would: every one gets a distinct address.
func TestReserveConcurrent(t *testing.T) {
	dir := t.TempDir()
	p := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}
	var wg sync.WaitGroup
	addrs := make([]netip.Addr, 50)
	errs := make([]error, 50)
	for i := range 50 {
		wg.Go(func() {
			a, err := Store{Dir: dir}.Reserve(p, nil, att(i))
			errs[i] = err
			if err == nil {
				addrs[i] = a[0]
			}
		})
	}
	wg.Wait()
	seen := map[netip.Addr]int{}
	for i, a := range addrs {
		if errs[i] != nil {
			t.Fatalf("reserve %d: %v", i, errs[i])
		}
		if j, dup := seen[a]; dup {
			t.Fatalf("%v handed to %d and %d", a, j, i)
		}
		seen[a] = i
	}
	if list, _ := (Store{Dir: dir}).List(); len(list) != 50 {
		t.Fatalf("%d reservations on disk, want 50", len(list))
	}
}

func TestReleaseExcept(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	p := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}
	for i := range 4 {
		s.Reserve(p, nil, att(i))
	}
	freed, err := s.ReleaseExcept([]Attachment{att(0).Attachment, att(2).Attachment})
	if err != nil || len(freed) != 2 {
		t.Fatalf("gc freed %v, %v", freed, err)
	}
	list, _ := s.List()
	for _, r := range list {
		if r.ContainerID != "c0" && r.ContainerID != "c2" {
			t.Errorf("%v survived gc", r)
		}
	}
}

// Wanted addresses (the runtime's `ips` capability) are given when free and
// usable, refused with ErrUnavailable otherwise, and ADD stays idempotent.
func TestReserveWanted(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	p := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24"), netip.MustParsePrefix("fd00:1::/64")}
	ten := netip.MustParseAddr("10.1.0.10")
	a, err := s.Reserve(p, []netip.Addr{ten}, att(1))
	if err != nil || len(a) != 2 || a[0] != ten || a[1] != netip.MustParseAddr("fd00:1::2") {
		t.Fatalf("reserve wanted %v: %v %v, want it and the first IPv6 address", ten, a, err)
	}
	if again, err := s.Reserve(p, []netip.Addr{ten}, att(1)); err != nil || again[0] != ten {
		t.Fatalf("reserve wanted again, same attachment: %v %v", again, err)
	}
	for _, bad := range []string{"10.1.0.10", "10.1.0.0", "10.1.0.1", "10.1.0.255", "10.2.0.5"} {
		if got, err := s.Reserve(p, []netip.Addr{netip.MustParseAddr(bad)}, att(2)); !errors.Is(err, ErrUnavailable) {
			t.Errorf("reserve wanted %s for another attachment: %v %v, want ErrUnavailable", bad, got, err)
		}
	}
	if list, _ := s.List(); len(list) != 2 {
		t.Fatalf("refused requests left reservations: %v", list)
	}
	// Allocation goes on after the wanted address.
	if b, err := s.Reserve(p[:1], nil, att(3)); err != nil || b[0] != netip.MustParseAddr("10.1.0.11") {
		t.Fatalf("reserve after a wanted address: %v %v, want 10.1.0.11", b, err)
	}
}
