// Package e2e holds the isthmus end-to-end tests (in e2e_test.go): each test
// builds its own lab from the default scenario with agents built from this
// checkout, and sends real traffic through the datapath. They need root.
package e2e
