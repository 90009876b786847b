package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Hook is where a program is attached; it is also the suffix of the link's pin.
type Hook string

// The hooks of docs/architecture.md.
const (
	HookPodIngress      Hook = "pod_ingress"       // tcx ingress on a pod-facing interface
	HookOverlayEgress   Hook = "overlay_egress"    // tcx egress on isthmus0
	HookUnderlayIngress Hook = "underlay_ingress"  // tcx ingress on the underlay device
	HookUnderlayXDP     Hook = "underlay_xdp"      // XDP on the underlay device
	HookUnderlayEgress  Hook = "underlay_egress"   // tcx egress on the underlay device
	HookWireGuard       Hook = "wireguard_ingress" // tcx ingress on the WireGuard device
)

// Program is the name of the program attached at h (the same as the hook's name).
func (h Hook) Program() string { return string(h) }

func (h Hook) valid() bool {
	switch h {
	case HookPodIngress, HookOverlayEgress, HookUnderlayIngress, HookUnderlayXDP, HookUnderlayEgress, HookWireGuard:
		return true
	}
	return false
}

func (h Hook) attach(prog *ebpf.Program, ifindex int) (link.Link, error) {
	switch h {
	case HookPodIngress, HookUnderlayIngress, HookWireGuard:
		return link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress})
	case HookOverlayEgress, HookUnderlayEgress:
		return link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXEgress})
	case HookUnderlayXDP:
		return link.AttachXDP(link.XDPOptions{Interface: ifindex, Program: prog})
	}
	return nil, fmt.Errorf("attach %s: unknown hook", h)
}

// LinkPin is the path of the pinned link for ifname at hook h:
// <pinDir>/links/<ifname>:<hook>, with every '.' of ifname written as ':'.
// bpffs refuses names with a dot (the kernel reserves them, EPERM), so the
// "<ifname>.<hook>" of the first design cannot be used; interface names never
// contain ':', so the name still parses back unambiguously (ListLinks).
func LinkPin(pinDir, ifname string, h Hook) string {
	return filepath.Join(pinDir, "links", strings.ReplaceAll(ifname, ".", ":")+":"+string(h))
}

// PinnedLink is one entry of <pinDir>/links.
type PinnedLink struct {
	Ifname string
	Hook   Hook
	Path   string
}

// ListLinks returns the pinned links under pinDir (none if the directory is missing).
func ListLinks(pinDir string) ([]PinnedLink, error) {
	entries, err := os.ReadDir(filepath.Join(pinDir, "links"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pinned links: %w", err)
	}
	var out []PinnedLink
	for _, e := range entries {
		i := strings.LastIndexByte(e.Name(), ':')
		if i <= 0 {
			continue
		}
		out = append(out, PinnedLink{
			Ifname: strings.ReplaceAll(e.Name()[:i], ":", "."),
			Hook:   Hook(e.Name()[i+1:]),
			Path:   filepath.Join(pinDir, "links", e.Name()),
		})
	}
	return out, nil
}

// Attached says what Attach did.
type Attached struct {
	// LinkID is the kernel's id of the bpf link.
	LinkID link.ID
	// Updated is true when an existing pinned link was switched to the program in
	// place (no detach window), false when a new link was created and pinned.
	Updated bool
}

// Attach makes prog run at hook h of interface ifname (index ifindex) through a
// link pinned at LinkPin(pinDir, ifname, h). If that pin already holds a link on
// the same interface, the link is updated to prog atomically; a pinned link whose
// interface is gone or was replaced (another ifindex) is unpinned and a new one
// created.
func Attach(pinDir string, h Hook, prog *ebpf.Program, ifname string, ifindex int) (Attached, error) {
	if !h.valid() {
		return Attached{}, fmt.Errorf("attach %s: unknown hook", h)
	}
	if prog == nil {
		return Attached{}, fmt.Errorf("attach %s on %s: no program", h, ifname)
	}
	path := LinkPin(pinDir, ifname, h)
	old, err := link.LoadPinnedLink(path, nil)
	switch {
	case err == nil:
		id, same := linkTarget(old, ifindex)
		if same {
			err := old.Update(prog)
			old.Close()
			if err != nil {
				return Attached{}, fmt.Errorf("update link %s: %w", path, err)
			}
			return Attached{LinkID: id, Updated: true}, nil
		}
		// Stale: the interface it was attached to is gone.
		old.Unpin()
		old.Close()
	case errors.Is(err, os.ErrNotExist):
	default:
		// Not a link we can use: drop the pin and attach afresh.
		if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			return Attached{}, fmt.Errorf("remove unusable pin %s: %w (after: %v)", path, rmErr, err)
		}
	}
	l, err := h.attach(prog, ifindex)
	if err != nil {
		return Attached{}, fmt.Errorf("attach %s on %s: %w", h, ifname, err)
	}
	defer l.Close()
	if err := l.Pin(path); err != nil {
		return Attached{}, fmt.Errorf("pin link %s: %w", path, err)
	}
	info, err := l.Info()
	if err != nil {
		return Attached{}, fmt.Errorf("read link info %s: %w", path, err)
	}
	return Attached{LinkID: info.ID}, nil
}

// linkTarget returns l's id and whether it is attached to ifindex.
func linkTarget(l link.Link, ifindex int) (link.ID, bool) {
	info, err := l.Info()
	if err != nil {
		return 0, false
	}
	if t := info.TCX(); t != nil {
		return info.ID, t.Ifindex != 0 && int(t.Ifindex) == ifindex
	}
	if x := info.XDP(); x != nil {
		return info.ID, x.Ifindex != 0 && int(x.Ifindex) == ifindex
	}
	return info.ID, false
}

// Detach removes the pinned link of ifname at h, which detaches its program. A link
// already gone is success.
func Detach(pinDir, ifname string, h Hook) error {
	return unpin(LinkPin(pinDir, ifname, h))
}

func unpin(path string) error {
	l, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		// Not a link (or a defunct one the kernel refuses to open): the file is
		// all there is to remove.
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove pin %s: %w", path, err)
		}
		return nil
	}
	defer l.Close()
	if err := l.Unpin(); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin link %s: %w", path, err)
	}
	return nil
}

// PruneLinks unpins every pinned link under pinDir that keep does not return true
// for, and returns those it removed.
func PruneLinks(pinDir string, keep func(PinnedLink) bool) ([]PinnedLink, error) {
	pins, err := ListLinks(pinDir)
	if err != nil {
		return nil, err
	}
	var removed []PinnedLink
	var errs []error
	for _, p := range pins {
		if keep(p) {
			continue
		}
		if err := unpin(p.Path); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}
