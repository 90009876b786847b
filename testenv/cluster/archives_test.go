package cluster

import "testing"

// TestDistinctArchives: two images written to one archive path (one
// overwrote the other, and a node would lack the first image) stop Up.
func TestDistinctArchives(t *testing.T) {
	if err := distinctArchives([]string{"/w/pause.oci.tar", "/w/probe.oci.tar", "/w/agnhost.oci.tar"}); err != nil {
		t.Errorf("distinct archives refused: %v", err)
	}
	if err := distinctArchives([]string{"/w/pause.oci.tar", "/w/probe.oci.tar", "/w/./pause.oci.tar"}); err == nil {
		t.Error("one archive named twice was accepted")
	}
}
