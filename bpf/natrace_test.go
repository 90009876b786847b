package bpf

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestSNATInsertRace: two CPUs run overlay_egress on the first packet of the same flow at
// the same moment, flow after flow. Whichever way their inserts interleave, every flow
// that has a forward entry must have the reply half it leads to: a CPU whose forward
// insert lost to the other's must not delete the reply entry the winner relies on
// (the reply would then never be translated back). The race window is a few hundred
// nanoseconds, so the test runs thousands of flows, the two threads pinned to
// different CPUs and released together by a spin barrier.
func TestSNATInsertRace(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Fatal("the SNAT insert race needs two CPUs to run on")
	}
	l := natLab(t, 40000, 40009, nil)
	const flows = 4000
	frame := func(i int) []byte {
		// What the stack forwards into isthmus0: a pod's UDP opens a flow, so
		// overlay_egress translates it.
		return stackForwarded(l, fromPod(l, podMAC, podIP, remotePodIP, 17, udpDatagram(uint16(20000+i), 53, []byte("race"))))
	}
	var (
		arrived atomic.Int64
		wg      sync.WaitGroup
		errs    = make(chan error, 2)
	)
	for cpu := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread dies with the goroutine, netns and all
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				errs <- fmt.Errorf("pin to CPU %d: %w", cpu, err)
				return
			}
			if err := netns.Set(l.ns); err != nil {
				errs <- fmt.Errorf("enter netns: %w", err)
				return
			}
			out := make([]byte, 1024)
			for i := range flows {
				in := frame(i)
				arrived.Add(1)
				for arrived.Load() < int64(2*(i+1)) {
				}
				opts := &ebpf.RunOptions{Data: in, DataOut: out, Context: skbCtx{Ifindex: uint32(l.ist.Attrs().Index)}}
				if _, err := l.objs.OverlayEgress.Run(opts); err != nil {
					errs <- fmt.Errorf("run flow %d: %w", i, err)
					for arrived.Load() < 2*flows { // let the other side finish
						arrived.Add(1)
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	broken, translated := 0, 0
	for i := range flows {
		fv, ok := natEntry(t, l, natKey(podIP, remotePodIP, uint16(20000+i), 53, 17))
		if !ok {
			continue
		}
		translated++
		if _, ok := natEntry(t, l, natKey(remotePodIP, tunnelIP, 53, nport(fv.Port), 17)); !ok {
			broken++
		}
	}
	t.Logf("%d flows, %d translated, %d without the reply half", flows, translated, broken)
	if translated == 0 {
		t.Fatal("no flow was translated: the test proves nothing")
	}
	if broken > 0 {
		t.Errorf("%d flows kept a forward entry whose reply half was deleted", broken)
	}
}
