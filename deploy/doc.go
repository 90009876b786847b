// Package deploy holds the Kubernetes manifests of isthmus (kubectl apply -k
// deploy/): the namespace, the CRDs generated into crds/, RBAC, the agent
// DaemonSet and the controller Deployment, and in uninstall/ the DaemonSet that
// removes the datapath from every node. It has no Go API; its test parses every
// manifest strictly into the Kubernetes types and checks the properties the
// design depends on. docs/install.md is the user's guide.
package deploy
