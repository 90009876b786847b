package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Uninstall removes everything the agent installed in this network namespace: the
// pinned links under pinDir (which detaches the programs), the pinned maps, the pin
// directory, isthmus0 with its routes (PodTable's go with it), FabricTable's
// routes (they leave by the underlay device, which stays), the policy rules of
// both tables (SyncRules), and the nat exemption chain
// and nftables table (EnsureMasqueradeExemption), the mangle chain of the flow
// marks (EnsureFlowMarks). It is idempotent: whatever is already
// gone counts as removed. ip_forward is left as it is.
func Uninstall(pinDir string) error {
	var errs []error
	if _, err := os.Stat(pinDir); err == nil {
		if err := CheckBPFFS(pinDir); err != nil {
			return err
		}
		if _, err := PruneLinks(pinDir, func(PinnedLink) bool { return false }); err != nil {
			errs = append(errs, err)
		}
		// Whatever is left is map pins and empty directories; unlinking a map pin
		// frees the map once no program holds it.
		if err := os.RemoveAll(pinDir); err != nil {
			errs = append(errs, fmt.Errorf("remove pin dir %s: %w", filepath.Clean(pinDir), err))
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("stat pin dir: %w", err))
	}
	if err := DeleteOverlay(); err != nil {
		errs = append(errs, err)
	}
	if _, err := SyncRules(KernelRules{}, nil); err != nil {
		errs = append(errs, err)
	}
	if _, err := SyncRules(KernelRules{Table: FabricTable, Priority: FabricRulePriority}, nil); err != nil {
		errs = append(errs, err)
	}
	if _, err := SyncRoutes(KernelRoutes{Table: FabricTable}, nil); err != nil {
		errs = append(errs, err)
	}
	if err := RemoveMasqueradeExemption(); err != nil {
		errs = append(errs, err)
	}
	if err := RemoveFlowMarks(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
