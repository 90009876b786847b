package v1alpha1

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	crvalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// crdDir holds the CRDs that `go generate ./api/v1alpha1` writes.
const crdDir = "../../deploy/crds"

var crdKinds = []struct {
	kind, plural string
	columns      []string
	cidrFields   []string
}{
	{KindSite, "sites", []string{"ManageCNI", "NodeCIDRs", "Nodes", "PoolExhausted", "Ready", "Age"},
		[]string{"spec.localCidrs", "spec.nodeCidrs", "spec.nonMasqueradeCIDRs", "spec.podCidrAssignments.cidrBlocks"}},
	{KindSitePeering, "sitepeerings", []string{"Sites", "Mesh", "Encryption", "Ready", "Age"}, nil},
	{KindGatewayPool, "gatewaypools", []string{"Type", "RoutedCIDRs", "Gateways", "Ready", "Age"}, []string{"spec.routedCidrs"}},
	{KindSiteGatewayPoolAssignment, "sitegatewaypoolassignments", []string{"Sites", "Pools", "Encryption", "Ready", "Age"}, nil},
}

// readCRD decodes deploy/crds/isthmus.dev_<plural>.yaml strictly and converts
// it to the internal form the API server validates.
func readCRD(t *testing.T, plural string) (*apiextensionsv1.CustomResourceDefinition, *apiextensions.CustomResourceDefinition) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(crdDir, Group+"_"+plural+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		t.Fatalf("decode %s CRD: %v", plural, err)
	}
	var internal apiextensions.CustomResourceDefinition
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&crd, &internal, nil); err != nil {
		t.Fatalf("convert %s CRD: %v", plural, err)
	}
	return &crd, &internal
}

func TestCRDFilesAreExactlyTheKinds(t *testing.T) {
	entries, err := os.ReadDir(crdDir)
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	for _, k := range crdKinds {
		want = append(want, Group+"_"+k.plural+".yaml")
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("files in %s (-want +got):\n%s", crdDir, diff)
	}
}

func TestCRDs(t *testing.T) {
	for _, k := range crdKinds {
		t.Run(k.kind, func(t *testing.T) {
			crd, internal := readCRD(t, k.plural)
			if crd.APIVersion != "apiextensions.k8s.io/v1" || crd.Kind != "CustomResourceDefinition" {
				t.Errorf("got %s %s, want apiextensions.k8s.io/v1 CustomResourceDefinition", crd.APIVersion, crd.Kind)
			}
			if want := k.plural + "." + Group; crd.Name != want {
				t.Errorf("metadata.name %q, want %q", crd.Name, want)
			}
			if crd.Spec.Group != Group || crd.Spec.Names.Kind != k.kind || crd.Spec.Names.ListKind != k.kind+"List" || crd.Spec.Names.Plural != k.plural {
				t.Errorf("group %q names %+v", crd.Spec.Group, crd.Spec.Names)
			}
			if crd.Spec.Scope != apiextensionsv1.ClusterScoped {
				t.Errorf("scope %q, want Cluster", crd.Spec.Scope)
			}
			if !slices.Contains(crd.Spec.Names.Categories, "isthmus") {
				t.Errorf("categories %v lack isthmus", crd.Spec.Names.Categories)
			}
			if len(crd.Spec.Versions) != 1 {
				t.Fatalf("%d versions, want 1", len(crd.Spec.Versions))
			}
			v := crd.Spec.Versions[0]
			if v.Name != GroupVersion.Version || !v.Served || !v.Storage {
				t.Errorf("version %q served %v storage %v", v.Name, v.Served, v.Storage)
			}
			if v.Subresources == nil || v.Subresources.Status == nil {
				t.Error("no status subresource")
			}
			var columns []string
			for _, c := range v.AdditionalPrinterColumns {
				columns = append(columns, c.Name)
			}
			if diff := cmp.Diff(k.columns, columns); diff != "" {
				t.Errorf("printer columns (-want +got):\n%s", diff)
			}
			status := v.Schema.OpenAPIV3Schema.Properties["status"]
			if _, ok := status.Properties["conditions"]; !ok {
				t.Error("status has no conditions")
			}
			if _, ok := status.Properties["observedGeneration"]; !ok {
				t.Error("status has no observedGeneration")
			}

			var cidrs []string
			walkCIDRFields(t, "spec", v.Schema.OpenAPIV3Schema.Properties["spec"], &cidrs)
			slices.Sort(cidrs)
			if diff := cmp.Diff(k.cidrFields, cidrs); diff != "" {
				t.Errorf("CIDR fields with isCIDR validation (-want +got):\n%s", diff)
			}

			// The checks the API server runs when the CRD is created:
			// structural schema, defaults, CEL compilation and cost. Its
			// create strategy fills status.storedVersions first.
			internal.Status.StoredVersions = []string{v.Name}
			if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), internal); len(errs) > 0 {
				t.Errorf("the API server would reject the CRD: %v", errs.ToAggregate())
			}
		})
	}
}

// walkCIDRFields appends the path of every string or string-list field under
// s whose name says it holds CIDRs, and fails the test for one that lacks the
// isCIDR rule.
func walkCIDRFields(t *testing.T, path string, s apiextensionsv1.JSONSchemaProps, out *[]string) {
	t.Helper()
	if s.Type == "array" && s.Items != nil && s.Items.Schema != nil {
		walkCIDRFields(t, path, *s.Items.Schema, out)
		return
	}
	name := path[strings.LastIndex(path, ".")+1:]
	if s.Type == "string" && strings.Contains(strings.ToLower(name), "cidr") {
		if !slices.ContainsFunc(s.XValidations, func(r apiextensionsv1.ValidationRule) bool { return r.Rule == "isCIDR(self)" }) {
			t.Errorf("%s: no isCIDR(self) rule", path)
		}
		*out = append(*out, path)
	}
	for field, p := range s.Properties {
		walkCIDRFields(t, path+"."+field, p, out)
	}
}

// admit runs what the API server does to a created object: defaulting,
// OpenAPI schema validation and the CEL rules. It returns the defaulted
// object and the errors.
func admit(t *testing.T, plural, manifest string) (map[string]any, field.ErrorList) {
	t.Helper()
	_, internal := readCRD(t, plural)
	// The conversion hoists the schema of a single version to spec.validation.
	props := internal.Spec.Validation.OpenAPIV3Schema
	structural, err := schema.NewStructural(props)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(manifest), &obj); err != nil {
		t.Fatal(err)
	}
	defaulting.Default(obj, structural)
	validator, _, err := crvalidation.NewSchemaValidator(props)
	if err != nil {
		t.Fatal(err)
	}
	errs := crvalidation.ValidateCustomResource(nil, obj, validator)
	celErrs, _ := cel.NewValidator(structural, true, celconfig.PerCallLimit).Validate(context.Background(), nil, structural, obj, nil, celconfig.RuntimeCELCostBudget)
	return obj, append(errs, celErrs...)
}

func TestCRDAdmission(t *testing.T) {
	tests := []struct {
		name, plural, manifest string
		// wantErrs are substrings, one per expected error, in order.
		wantErrs []string
	}{
		{"valid site", "sites", `
apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: flex-site}
spec:
  nodeCidrs: [10.0.0.0/27, "2001:db8::/64"]
  podCidrAssignments:
  - cidrBlocks: [10.0.2.0/23]
    nodeBlockSizes: {ipv4: 25}
  localCidrs: [10.0.0.0/16]
`, nil},
		{"bad CIDRs", "sites", `
apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: flex-site}
spec:
  nodeCidrs: [10.0.0.0/27, 10.0.0.0/33]
  podCidrAssignments:
  - cidrBlocks: [10.0.2.0]
  localCidrs: [flex]
`, []string{
			`spec.localCidrs[0]: Invalid value: "flex": must be a CIDR`,
			`spec.nodeCidrs[1]: Invalid value: "10.0.0.0/33": must be a CIDR`,
			`spec.podCidrAssignments[0].cidrBlocks[0]: Invalid value: "10.0.2.0": must be a CIDR`,
		}},
		{"enums and ranges", "sites", `
apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: s}
spec:
  returnPath: Tunnel
  tunnelMTU: 100
  podCidrAssignments:
  - cidrBlocks: [10.0.2.0/23]
    nodeBlockSizes: {ipv4: 33}
`, []string{
			"spec.podCidrAssignments[0].nodeBlockSizes.ipv4: Invalid value: 33",
			"spec.returnPath: Unsupported value: \"Tunnel\"",
			"spec.tunnelMTU: Invalid value: 100",
		}},
		{"peering of one site", "sitepeerings", `
apiVersion: isthmus.dev/v1alpha1
kind: SitePeering
metadata: {name: p}
spec: {sites: [a], tunnelProtocol: VXLAN, encryption: IPsec}
`, []string{
			"spec.encryption: Unsupported value: \"IPsec\"",
			"spec.sites: Invalid value: 1",
			"spec.tunnelProtocol: Unsupported value: \"VXLAN\"",
		}},
		{"pool type and routed CIDRs", "gatewaypools", `
apiVersion: isthmus.dev/v1alpha1
kind: GatewayPool
metadata: {name: gw}
spec:
  type: Public
  nodeSelector: {matchLabels: {gw: "yes"}}
  routedCidrs: [10.0.2.0/23, 10.0.300.0/24]
`, []string{
			`spec.routedCidrs[1]: Invalid value: "10.0.300.0/24": must be a CIDR`,
			`spec.type: Unsupported value: "Public"`,
		}},
		{"assignment without pools", "sitegatewaypoolassignments", `
apiVersion: isthmus.dev/v1alpha1
kind: SiteGatewayPoolAssignment
metadata: {name: a}
spec: {sites: [a, b], gatewayPools: [], encryption: wireguard}
`, []string{"spec.encryption: Unsupported value: \"wireguard\"", "spec.gatewayPools: Invalid value: 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errs := admit(t, tt.plural, tt.manifest)
			var got []string
			for _, e := range errs {
				got = append(got, e.Error())
			}
			slices.Sort(got)
			if len(got) != len(tt.wantErrs) {
				t.Fatalf("got %d errors, want %d:\n%s", len(got), len(tt.wantErrs), strings.Join(got, "\n"))
			}
			for i, want := range tt.wantErrs {
				if !strings.Contains(got[i], want) {
					t.Errorf("error %d: got %q, want it to contain %q", i, got[i], want)
				}
			}
		})
	}
}

func TestCRDDefaults(t *testing.T) {
	site, errs := admit(t, "sites", `
apiVersion: isthmus.dev/v1alpha1
kind: Site
metadata: {name: s}
spec: {nodeCidrs: [10.0.0.0/27]}
`)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	peering, errs := admit(t, "sitepeerings", `
apiVersion: isthmus.dev/v1alpha1
kind: SitePeering
metadata: {name: p}
spec: {sites: [a, b]}
`)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	assignment, errs := admit(t, "sitegatewaypoolassignments", `
apiVersion: isthmus.dev/v1alpha1
kind: SiteGatewayPoolAssignment
metadata: {name: a}
spec: {sites: [a, b], gatewayPools: [gw]}
`)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	// The same defaults as the accessor methods apply to objects from files.
	got := map[string]any{
		"manageCniPlugin":      site["spec"].(map[string]any)["manageCniPlugin"],
		"returnPath":           site["spec"].(map[string]any)["returnPath"],
		"meshNodes":            peering["spec"].(map[string]any)["meshNodes"],
		"tunnelProtocol":       peering["spec"].(map[string]any)["tunnelProtocol"],
		"routeNodeCidrs":       assignment["spec"].(map[string]any)["routeNodeCidrs"],
		"underlayReachesNodes": assignment["spec"].(map[string]any)["underlayReachesNodes"],
		"peeringEncryption":    peering["spec"].(map[string]any)["encryption"],
		"assignmentEncryption": assignment["spec"].(map[string]any)["encryption"],
	}
	var zero SiteSpec
	var zp SitePeeringSpec
	var za SiteGatewayPoolAssignmentSpec
	want := map[string]any{
		"manageCniPlugin":      zero.ManagesCNIPlugin(),
		"returnPath":           string(zero.ReturnPathOrDefault()),
		"meshNodes":            zp.MeshesNodes(),
		"tunnelProtocol":       string(zp.Protocol()),
		"routeNodeCidrs":       za.RoutesNodeCIDRs(),
		"underlayReachesNodes": za.ReachesNodesOnUnderlay(),
		"peeringEncryption":    string(zp.EncryptionOrDefault()),
		"assignmentEncryption": string(za.EncryptionOrDefault()),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("defaults (-accessors +CRD):\n%s", diff)
	}
}
