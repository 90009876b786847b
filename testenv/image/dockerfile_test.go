package image

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// dockerfile is what the repository's Dockerfile says about the image.
type dockerfile struct {
	base       string   // the final stage's FROM
	packages   []string // apt-get install's packages
	binaries   []Binary // COPY --from=build destinations and the main package built to each source
	entrypoint []string
	labels     map[string]string
}

// parseDockerfile reads the instructions the image builder mirrors, with
// line continuations joined; it knows only the shapes this Dockerfile uses
// and fails on any it does not recognise among them.
func parseDockerfile(t *testing.T, text string) dockerfile {
	t.Helper()
	var instrs []string
	var cur strings.Builder
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasPrefix(trimmed, "#") { // a comment inside a continued instruction
			continue
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			continue
		}
		cur.WriteString(trimmed)
		instrs = append(instrs, cur.String())
		cur.Reset()
	}
	d := dockerfile{labels: map[string]string{}}
	built := map[string]string{} // go build -o output to main package
	buildRe := regexp.MustCompile(`go build [^&]*?-o (\S+) (\./\S+|github\.com/\S+)`)
	labelRe := regexp.MustCompile(`([\w.]+)="([^"]*)"`)
	for _, in := range instrs {
		op, rest, _ := strings.Cut(in, " ")
		switch strings.ToUpper(op) {
		case "FROM":
			d.base = strings.Fields(rest)[0]
		case "RUN":
			for _, m := range buildRe.FindAllStringSubmatch(rest, -1) {
				built[m[1]] = m[2]
			}
			if _, after, ok := strings.Cut(rest, "apt-get install "); ok {
				args, _, _ := strings.Cut(after, "&&")
				for _, w := range strings.Fields(args) {
					if !strings.HasPrefix(w, "-") {
						d.packages = append(d.packages, w)
					}
				}
			}
		case "COPY":
			f := strings.Fields(rest)
			if len(f) == 3 && f[0] == "--from=build" {
				main, ok := built[f[1]]
				if !ok {
					t.Fatalf("Dockerfile: COPY %s: no go build -o %s in the build stage", f[1], f[1])
				}
				d.binaries = append(d.binaries, Binary{Path: f[2], Main: main})
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &d.entrypoint); err != nil {
				t.Fatalf("Dockerfile: ENTRYPOINT %s: %v", rest, err)
			}
		case "LABEL":
			for _, m := range labelRe.FindAllStringSubmatch(rest, -1) {
				d.labels[m[1]] = m[2]
			}
		}
	}
	return d
}

// TestDockerfileMatches: the Dockerfile (the recipe for users with a
// registry) and this builder make the same image: the same Debian suite, the
// same packages, the same binaries from the same main packages at the same
// paths, the same entrypoint and labels.
func TestDockerfileMatches(t *testing.T) {
	root, err := moduleRoot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	d := parseDockerfile(t, string(text))
	if want := "debian:" + Suite + "-slim"; d.base != want {
		t.Errorf("Dockerfile's final stage is FROM %s; the builder makes %s", d.base, want)
	}
	if len(d.packages) == 0 {
		t.Fatal("Dockerfile: no apt-get install line found")
	}
	if diff := cmp.Diff(slices.Sorted(slices.Values(d.packages)), slices.Sorted(slices.Values(Packages))); diff != "" {
		t.Errorf("packages: Dockerfile (-) and image.Packages (+) differ:\n%s", diff)
	}
	if len(d.binaries) == 0 {
		t.Fatal("Dockerfile: no COPY --from=build line found")
	}
	if diff := cmp.Diff(d.binaries, Binaries); diff != "" {
		t.Errorf("binaries: Dockerfile (-) and image.Binaries (+) differ:\n%s", diff)
	}
	if diff := cmp.Diff(d.entrypoint, Entrypoint); diff != "" {
		t.Errorf("entrypoint: Dockerfile (-) and image.Entrypoint (+) differ:\n%s", diff)
	}
	if diff := cmp.Diff(d.labels, Labels("${VERSION}")); diff != "" {
		t.Errorf("labels: Dockerfile (-) and image.Labels (+) differ:\n%s", diff)
	}
}

// TestParseDockerfileSeesChanges: the parser reads what a change to the
// Dockerfile would alter, so TestDockerfileMatches cannot pass by reading
// nothing.
func TestParseDockerfileSeesChanges(t *testing.T) {
	text := `FROM golang:1.26 AS build
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w" -o /out/a ./cmd/a \
 && go build -o /out/b ./cmd/b
FROM debian:forky-slim
LABEL x.title="t" \
      x.version="${VERSION}"
# a comment
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl \
      jq \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/b /usr/bin/b
COPY --from=build /out/a /usr/local/bin/a
ENTRYPOINT ["a", "x"]
`
	got := parseDockerfile(t, text)
	want := dockerfile{
		base:       "debian:forky-slim",
		packages:   []string{"curl", "jq"},
		binaries:   []Binary{{Path: "/usr/bin/b", Main: "./cmd/b"}, {Path: "/usr/local/bin/a", Main: "./cmd/a"}},
		entrypoint: []string{"a", "x"},
		labels:     map[string]string{"x.title": "t", "x.version": "${VERSION}"},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(dockerfile{})); diff != "" {
		t.Errorf("parseDockerfile (-want +got):\n%s", diff)
	}
}

// TestRef: containerd's normalised names, which the kubelet's CRI looks a
// pod's image up by.
func TestRef(t *testing.T) {
	for _, c := range []struct{ name, version, want string }{
		{"", "", "docker.io/library/isthmus:dev"},
		{"isthmus", "v1.2.3", "docker.io/library/isthmus:v1.2.3"},
		{"isthmus-dev/isthmus", "v1", "docker.io/isthmus-dev/isthmus:v1"},
		{"ghcr.io/isthmus-dev/isthmus", "v1", "ghcr.io/isthmus-dev/isthmus:v1"},
		{"localhost/isthmus", "v1", "localhost/isthmus:v1"},
		{"registry.local:5000/isthmus", "v1", "registry.local:5000/isthmus:v1"},
	} {
		if got := Ref(c.name, c.version); got != c.want {
			t.Errorf("Ref(%q, %q) = %q, want %q", c.name, c.version, got, c.want)
		}
		if name, tag := splitRef(c.want); name+":"+tag != c.want || strconv.Quote(tag) == `""` {
			t.Errorf("splitRef(%q) = %q, %q", c.want, name, tag)
		}
	}
}
