package objects

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	corev1 "k8s.io/api/core/v1"
	kjson "sigs.k8s.io/json"

	"github.com/isthmus-dev/isthmus/api/v1alpha1"
)

// entry is a decoded object and where it came from.
type entry[T any] struct {
	obj   *T
	file  string
	label string // Kind "name"
}

type loader struct {
	sites    []entry[v1alpha1.Site]
	peerings []entry[v1alpha1.SitePeering]
	pools    []entry[v1alpha1.GatewayPool]
	assigns  []entry[v1alpha1.SiteGatewayPoolAssignment]
	nodes    []entry[corev1.Node]
	errs     []error
	warnings []Warning
	rules    Rules
	// facts are the per-Node findings of this validation (see factsOf);
	// previous those a Validator kept from the last one, by name.
	facts    map[*corev1.Node]*nodeFacts
	previous map[string]*nodeFacts
}

func (l *loader) errorf(file, object, field, format string, args ...any) {
	l.errs = append(l.errs, &Error{File: file, Object: object, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (l *loader) warnf(file, object, field, format string, args ...any) {
	l.warnings = append(l.warnings, Warning{File: file, Object: object, Field: field, Message: fmt.Sprintf(format, args...)})
}

// document is one YAML document of a file and the line it starts on.
type document struct {
	data []byte
	line int
}

// splitDocuments splits a multi-document YAML stream on its "---" lines.
func splitDocuments(data []byte) []document {
	var docs []document
	cur := document{line: 1}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), len(data)+1)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if isDocumentMarker(line) {
			docs = append(docs, cur)
			cur = document{line: n + 1}
			continue
		}
		cur.data = append(cur.data, line...)
		cur.data = append(cur.data, '\n')
	}
	return append(docs, cur)
}

func isDocumentMarker(line string) bool {
	rest, ok := strings.CutPrefix(line, "---")
	return ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t')
}

// yamlToJSON converts one YAML document to JSON, nil for an empty document.
// It reads YAML 1.2, where only true and false are booleans: YAML 1.1 (and
// sigs.k8s.io/yaml without a typed target) would read a node named "n" or
// "on" as a boolean. Duplicate keys are errors.
func yamlToJSON(doc []byte) ([]byte, error) {
	var v any
	if err := yaml.Unmarshal(doc, &v); err != nil {
		return nil, err
	}
	if v == nil {
		return nil, nil
	}
	js, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("convert to JSON: %w", err)
	}
	return js, nil
}

// header is the part of every object read before the kind is known.
type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

func (l *loader) decodeFile(file string, data []byte) {
	for i, doc := range splitDocuments(data) {
		where := fmt.Sprintf("document %d (line %d)", i+1, doc.line)
		js, err := yamlToJSON(doc.data)
		if err != nil {
			l.errorf(file, where, "", "parse YAML: %v", err)
			continue
		}
		if js == nil {
			continue // an empty document, such as comments only
		}
		l.decodeObject(file, where, js)
	}
}

// decodeObject decodes one object given as JSON; where locates it in its file
// until its name is known.
func (l *loader) decodeObject(file, where string, js []byte) {
	var h header
	if err := json.Unmarshal(js, &h); err != nil {
		l.errorf(file, where, "", "decode object: %v", trimJSON(err))
		return
	}
	object := where
	if h.Kind != "" && h.Metadata.Name != "" {
		object = label(h.Kind, h.Metadata.Name)
	}
	want := map[string]string{
		v1alpha1.KindSite:                      v1alpha1.GroupVersion.String(),
		v1alpha1.KindSitePeering:               v1alpha1.GroupVersion.String(),
		v1alpha1.KindGatewayPool:               v1alpha1.GroupVersion.String(),
		v1alpha1.KindSiteGatewayPoolAssignment: v1alpha1.GroupVersion.String(),
		"Node":                                 "v1",
		"List":                                 "v1",
	}
	switch wantVersion, known := want[h.Kind]; {
	case h.Kind == "":
		l.errorf(file, object, "kind", "required")
		return
	case !known:
		l.errorf(file, object, "kind", "unknown kind %q (want Site, SitePeering, GatewayPool, SiteGatewayPoolAssignment or Node)", h.Kind)
		return
	case h.APIVersion == "":
		l.errorf(file, object, "apiVersion", "required (want %s)", wantVersion)
		return
	case h.APIVersion != wantVersion:
		l.errorf(file, object, "apiVersion", "unknown apiVersion %q for %s (want %s)", h.APIVersion, h.Kind, wantVersion)
		return
	}
	if h.Kind == "List" {
		// kubectl get nodes -o yaml writes a List; accept it as its items.
		for i, item := range h.Items {
			l.decodeObject(file, fmt.Sprintf("%s items[%d]", where, i), item)
		}
		return
	}
	if h.Metadata.Name == "" {
		l.errorf(file, fmt.Sprintf("%s %s", h.Kind, where), "metadata.name", "required")
		return
	}
	switch h.Kind {
	case v1alpha1.KindSite:
		if obj, ok := decodeStrict[v1alpha1.Site](l, file, object, js); ok {
			l.sites = append(l.sites, entry[v1alpha1.Site]{obj, file, object})
		}
	case v1alpha1.KindSitePeering:
		if obj, ok := decodeStrict[v1alpha1.SitePeering](l, file, object, js); ok {
			l.peerings = append(l.peerings, entry[v1alpha1.SitePeering]{obj, file, object})
		}
	case v1alpha1.KindGatewayPool:
		if obj, ok := decodeStrict[v1alpha1.GatewayPool](l, file, object, js); ok {
			l.pools = append(l.pools, entry[v1alpha1.GatewayPool]{obj, file, object})
		}
	case v1alpha1.KindSiteGatewayPoolAssignment:
		if obj, ok := decodeStrict[v1alpha1.SiteGatewayPoolAssignment](l, file, object, js); ok {
			l.assigns = append(l.assigns, entry[v1alpha1.SiteGatewayPoolAssignment]{obj, file, object})
		}
	case "Node":
		if obj, ok := decodeStrict[corev1.Node](l, file, object, js); ok {
			l.nodes = append(l.nodes, entry[corev1.Node]{obj, file, object})
		}
	}
}

func decodeStrict[T any](l *loader, file, object string, js []byte) (*T, bool) {
	obj := new(T)
	// Case-sensitive, unlike encoding/json: nodeCIDRs must not pass for
	// nodeCidrs, since the two spellings sit side by side in a Site.
	strictErrs, err := kjson.UnmarshalStrict(js, obj)
	if err != nil {
		l.errorf(file, object, "", "decode: %v", trimJSON(err))
		return nil, false
	}
	for _, e := range strictErrs {
		l.errorf(file, object, "", "decode: %v", trimJSON(e))
	}
	return obj, len(strictErrs) == 0
}

// trimJSON drops the "json: " prefix that adds nothing for a YAML user.
func trimJSON(err error) string {
	return strings.TrimPrefix(err.Error(), "json: ")
}
