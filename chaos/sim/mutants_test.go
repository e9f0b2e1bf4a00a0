package sim

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMutantPatchesApply: every mutant of chaos/mutants applies to this
// tree (git apply --check, which needs no repository), so that the power
// table (table.sh) runs each one instead of reporting "patch does not
// apply" in a row that is easy to miss. A change that moves the code a
// patch edits regenerates the patch in the same commit: 39 stopped
// applying at 61bac54, 40 and 42 with the semaphore's wake, and each was
// noticed only in a later table.
func TestMutantPatchesApply(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	patches, err := filepath.Glob(filepath.Join(root, "chaos", "mutants", "*.patch"))
	require.NoError(t, err)
	require.NotEmpty(t, patches, "no mutant found under %s", root)
	for _, p := range patches {
		cmd := exec.Command("git", "apply", "--check", p)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		assert.NoError(t, err, "%s does not apply: %s", filepath.Base(p), out)
	}
	t.Logf("%d mutants apply", len(patches))
}
