package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/isthmus-dev/isthmus/loader/health"
)

// DefaultAddr is the default of the agent's --metrics-addr.
const DefaultAddr = ":9963"

// Status is what /healthz and /readyz ask. A nil error means healthy or ready;
// an error's text is the reason served with the 503.
type Status interface {
	Live() error
	Ready() error
}

// NewRegistry returns a registry with the Collector over src and peers, the Go
// runtime and process collectors, and the sync metrics it returns.
func NewRegistry(src Source, peers func() []health.PeerState) (*prometheus.Registry, *Sync) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(src, peers),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg, NewSync(reg)
}

// Handler serves /metrics from g, and /healthz and /readyz from st: 200 "ok", or
// 503 with the reason.
func Handler(g prometheus.Gatherer, st Status, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.HandleFunc("GET /healthz", probe(st.Live))
	mux.HandleFunc("GET /readyz", probe(st.Ready))
	return mux
}

func probe(check func() error) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := check(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintln(w, "ok")
	}
}

// Serve listens on addr in the network namespace of the calling thread and
// serves h until ctx is done. It returns once listening; the returned channel
// gets the server's error, or nil after a shutdown.
func Serve(ctx context.Context, addr string, h http.Handler) (<-chan error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		errc <- err
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	return errc, nil
}
