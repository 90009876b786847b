// Package clusterdns gives the lab's whole cluster a cluster DNS as kubeadm
// does: CoreDNS (built from the Go module proxy by kubebin.CoreDNS) in an
// image of its binary alone, deployed from coredns.yaml as a Deployment in
// kube-system behind the kube-dns Service at kube.ClusterDNSIP. The kubelets
// hand that address to their pods (cri.KubeletConfig.ClusterDNS); kube-proxy
// carries the Service; CoreDNS reaches the API server through the kubernetes
// Service (testenv.Lab.ServeAPIToPods).
package clusterdns

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"text/template"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/isthmus-dev/isthmus/testenv/image"
	"github.com/isthmus-dev/isthmus/testenv/kube"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

//go:embed coredns.yaml
var manifest string

var manifestTmpl = template.Must(template.New("coredns.yaml").Option("missingkey=error").Parse(manifest))

// Namespace, Deployment and Service are where the cluster DNS lives, as
// kubeadm names them.
const (
	Namespace  = "kube-system"
	Deployment = "coredns"
	Service    = "kube-dns"
)

// ImageRepository is the name of the CoreDNS image, kubeadm's; the tag is the
// CoreDNS version (kubebin.CoreDNSVersion). The image is built here
// (BuildImage), so a pod spec naming it never pulls.
const ImageRepository = "registry.k8s.io/coredns/coredns"

// Image returns the image name of the CoreDNS that kubebin.CoreDNS builds,
// ImageRepository:<version>.
func Image() (string, error) {
	v, err := kubebin.CoreDNSVersion()
	if err != nil {
		return "", err
	}
	return ImageRepository + ":" + v, nil
}

// BuildImage builds CoreDNS (kubebin.CoreDNS: cached after the first build)
// and writes its image, Image(), into dir as an OCI archive holding /coredns
// and nothing else (it is static), entrypoint /coredns as upstream's. The
// archive imports into a node's containerd like testenv/cri's images. The
// image runs CoreDNS as root (the manifest gives it NET_BIND_SERVICE alone):
// upstream's runs it as a user with a file capability, which this layer
// does not carry.
func BuildImage(ctx context.Context, dir string) (image.Archive, error) {
	bin, err := kubebin.CoreDNS(ctx)
	if err != nil {
		return image.Archive{}, fmt.Errorf("build the CoreDNS image: %w", err)
	}
	ref, err := Image()
	if err != nil {
		return image.Archive{}, fmt.Errorf("build the CoreDNS image: %w", err)
	}
	return image.WriteFiles(filepath.Join(dir, "coredns.oci.tar"), ref, map[string]string{"coredns": bin}, []string{"/coredns"})
}

// Config says how DeployClusterDNS deploys the cluster DNS. The zero value
// is kubeadm's: Image(), kube.ClusterDNSIP, kube.ClusterDomain, two replicas
// on any Linux node.
type Config struct {
	// Image is the CoreDNS image; default Image().
	Image string
	// ServiceIP is the kube-dns Service's ClusterIP, in the API server's
	// service range; the kubelets' clusterDNS. Default kube.ClusterDNSIP.
	ServiceIP netip.Addr
	// Domain is the cluster's DNS domain, the kubelets' clusterDomain.
	// Default kube.ClusterDomain.
	Domain string
	// Replicas of the Deployment; default 2.
	Replicas int
	// NodeSelector is added to the pods' nodeSelector (kubernetes.io/os:
	// linux), e.g. to place them on the nodes of one site.
	NodeSelector map[string]string
}

func (c Config) withDefaults() (Config, error) {
	if c.Image == "" {
		img, err := Image()
		if err != nil {
			return c, err
		}
		c.Image = img
	}
	if !c.ServiceIP.IsValid() {
		c.ServiceIP = kube.ClusterDNSIP
	}
	if c.Domain == "" {
		c.Domain = kube.ClusterDomain
	}
	if c.Replicas == 0 {
		c.Replicas = 2
	}
	sel := map[string]string{"kubernetes.io/os": "linux"}
	maps.Copy(sel, c.NodeSelector)
	c.NodeSelector = sel
	return c, nil
}

// Objects returns the objects of coredns.yaml for cfg, in the order they
// are applied.
func Objects(cfg Config) ([]*unstructured.Unstructured, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := manifestTmpl.Execute(&b, cfg); err != nil {
		return nil, fmt.Errorf("render coredns.yaml: %w", err)
	}
	return kube.DecodeManifests("coredns.yaml", b.Bytes())
}

// DeployClusterDNS applies the cluster DNS of cfg (Objects) to the API
// server rc reaches, with server-side apply, and waits up to timeout until
// every replica of the Deployment is ready (CoreDNS' ready plugin: its
// kubernetes plugin has synced with the API server). Each node that may run
// it must have the image imported (BuildImage); kube-proxy must run for
// the pods to reach the kubernetes Service and for clients to reach kube-dns.
func DeployClusterDNS(ctx context.Context, rc *rest.Config, cfg Config, timeout time.Duration) error {
	objs, err := Objects(cfg)
	if err != nil {
		return err
	}
	if err := kube.ApplyTo(ctx, rc, objs, kube.ApplyOptions{}); err != nil {
		return fmt.Errorf("deploy the cluster DNS: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("deploy the cluster DNS: %w", err)
	}
	var dep *appsv1.Deployment
	deadline := time.Now().Add(timeout)
	for {
		dep, err = cs.AppsV1().Deployments(Namespace).Get(ctx, Deployment, metav1.GetOptions{})
		if err == nil && dep.Spec.Replicas != nil && dep.Status.ObservedGeneration >= dep.Generation &&
			dep.Status.ReadyReplicas == *dep.Spec.Replicas && dep.Status.UpdatedReplicas == *dep.Spec.Replicas {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("deploy the cluster DNS: Deployment %s/%s not ready after %s: %w", Namespace, Deployment, timeout, err)
			}
			return fmt.Errorf("deploy the cluster DNS: Deployment %s/%s not ready after %s: status %+v", Namespace, Deployment, timeout, dep.Status)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
