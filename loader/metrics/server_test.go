package metrics

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/maps"
)

type fakeStatus struct{ live, ready error }

func (f *fakeStatus) Live() error  { return f.live }
func (f *fakeStatus) Ready() error { return f.ready }

func get(t *testing.T, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	st := &fakeStatus{ready: errors.New("first sync not done")}
	src := fakeSource{
		counters: map[maps.MetricKey]maps.Counter{{Code: 1, Hook: maps.HookPodIngress}: {Packets: 3, Bytes: 294}},
		levelErr: errors.New("open pinned map nat: gone"),
	}
	reg, sync := NewRegistry(src, nil)
	sync.Observe(0, 4, fakeNow, nil)
	srv := httptest.NewServer(Handler(reg, st, nil))
	defer srv.Close()

	if code, body := get(t, srv, "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q, want 200 ok", code, body)
	}
	if code, body := get(t, srv, "/readyz"); code != 503 || !strings.Contains(body, "first sync not done") {
		t.Errorf("/readyz not ready: %d %q, want 503 with the reason", code, body)
	}
	st.ready = nil
	if code, _ := get(t, srv, "/readyz"); code != 200 {
		t.Errorf("/readyz ready: %d, want 200", code)
	}
	st.live = errors.New("loop stuck for 1m0s")
	if code, body := get(t, srv, "/healthz"); code != 503 || !strings.Contains(body, "loop stuck") {
		t.Errorf("/healthz stuck: %d %q, want 503 with the reason", code, body)
	}

	// A map that cannot be read does not hide the rest of the scrape.
	code, body := get(t, srv, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	for _, want := range []string{
		`isthmus_datapath_packets_total{event="encap",hook="pod_ingress"} 3`,
		`isthmus_sync_entries_written_total 4`,
		`isthmus_syncs_total{result="ok"} 1`,
		`go_goroutines `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "isthmus_map_entries") {
		t.Errorf("/metrics has map levels though the source failed")
	}
	if code, _ := get(t, srv, "/nothing"); code != 404 {
		t.Errorf("/nothing: %d, want 404", code)
	}
}

var fakeNow = time.Unix(1700000000, 0)
