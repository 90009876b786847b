package conformance

import (
	"context"

	"github.com/isthmus-dev/isthmus/testenv/kube/e2eimages"
)

// SuiteImages builds the test images the suite's network cases ask for
// (agnhost, pause, glibc-dns-testing and nginx, testenv/kube/e2eimages,
// under the names e2eTest gives them) into dir and returns their OCI archives, for import into every
// node's containerd: nothing is pulled.
func SuiteImages(ctx context.Context, dir, e2eTest string) ([]string, error) {
	built, err := e2eimages.Build(ctx, dir, e2eTest)
	if err != nil {
		return nil, err
	}
	var archives []string
	for _, a := range built {
		archives = append(archives, a.Path)
	}
	return archives, nil
}
