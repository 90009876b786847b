package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// CNIPhases are the values of isthmus_cni_state's label, as
// cniinstall.State names them.
var CNIPhases = []string{"pending", "installed", "foreign_config", "not_managed"}

// CNI holds the metrics of the agent's CNI install. A nil *CNI records
// nothing.
type CNI struct {
	state   *prometheus.GaugeVec
	foreign *prometheus.GaugeVec
}

// NewCNI returns the CNI install metrics, registered with reg.
func NewCNI(reg prometheus.Registerer) *CNI {
	c := &CNI{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isthmus_cni_state",
			Help: "1 for the state of the agent's CNI install (pending, installed, foreign_config: held back by another plugin's configuration, not_managed: the Site has manageCniPlugin false), 0 for the others.",
		}, []string{"state"}),
		foreign: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "isthmus_cni_foreign_config",
			Help: "1 for each configuration of another plugin in the CNI configuration directory (--cni-conf-dir).",
		}, []string{"file"}),
	}
	reg.MustRegister(c.state, c.foreign)
	c.Set("pending", nil)
	return c
}

// Set records the phase reached and the other plugins' configurations.
func (c *CNI) Set(phase string, foreign []string) {
	if c == nil {
		return
	}
	setOneOf(c.state, CNIPhases, phase)
	c.foreign.Reset()
	for _, f := range foreign {
		c.foreign.WithLabelValues(f).Set(1)
	}
}
