package controller

import (
	"regexp"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

var (
	siteInMessage = regexp.MustCompile(`Site "([^"]+)"`)
	nodeInMessage = regexp.MustCompile(`Node "([^"]+)"`)
)

// problemsBySite runs objects.Validate, the rules of file mode, over the
// Sites and Nodes and files each problem under every Site it concerns: the
// Site it is reported on, every Site its message names (an overlap concerns
// both sides), and for every Node it names, the Sites whose nodeCidrs hold
// it. Problems of Nodes in no Site concern no Site and are dropped: a
// cluster may run nodes isthmus does not join.
func problemsBySite(sites []v1alpha1.Site, nodes []corev1.Node) map[string][]string {
	_, _, err := objects.Validate(objects.Objects{Sites: sites, Nodes: nodes})
	m := sitesOf(sites, nodes)
	out := make(map[string][]string)
	for _, oe := range objects.Errors(err) {
		var concerns []string
		for _, sm := range siteInMessage.FindAllStringSubmatch(oe.Object+" "+oe.Msg, -1) {
			concerns = append(concerns, sm[1])
		}
		for _, nm := range nodeInMessage.FindAllStringSubmatch(oe.Object+" "+oe.Msg, -1) {
			for _, s := range m[nm[1]] {
				concerns = append(concerns, s.Name)
			}
		}
		slices.Sort(concerns)
		msg := oe.Object + ": " + oe.Msg
		if oe.Field != "" {
			msg = oe.Object + " " + oe.Field + ": " + oe.Msg
		}
		for _, s := range slices.Compact(concerns) {
			out[s] = append(out[s], msg)
		}
	}
	return out
}
