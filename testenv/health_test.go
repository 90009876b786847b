package testenv

import (
	"slices"
	"testing"
)

// TestPeerUpZero: the lab's readiness reads which peers an agent finds down
// from its /metrics; only isthmus_peer_up series at 0 count, whatever else the
// exposition holds.
func TestPeerUpZero(t *testing.T) {
	exposition := `# HELP isthmus_peer_up 1 if the peer answers its health checks; 0 if not.
# TYPE isthmus_peer_up gauge
isthmus_peer_up{peer="gw-e1",site="west"} 1
isthmus_peer_up{peer="gw-e2",site="west"} 0
isthmus_peer_up{peer="gw-w1",site=""} 0 1733560000000
isthmus_peer_up{peer="gw-w2",site=""} 10
isthmus_peer_up{peer="gw-w3",site=""} 0.5
isthmus_peer_up_seconds{peer="gw-w4"} 0
isthmus_peer_transitions_total{peer="gw-e2",site="west",state="down"} 0
isthmus_drops_total{reason="no_route"} 0
isthmus_peer_up{peer="broken",site=""}
`
	got := peerUpZero(exposition)
	want := []string{`isthmus_peer_up{peer="gw-e2",site="west"}`, `isthmus_peer_up{peer="gw-w1",site=""}`}
	if !slices.Equal(got, want) {
		t.Errorf("peerUpZero = %q, want %q", got, want)
	}
	if got := peerUpZero("isthmus_peer_up{peer=\"b1\",site=\"\"} 1\n"); len(got) != 0 {
		t.Errorf("every peer up: peerUpZero = %q, want none", got)
	}
}
