package gobuild_test

import (
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/gobuild"
)

// The flags are the ones this test binary was built with: -race as the
// race build tag says, -trimpath as the file names the runtime reports say
// (absolute without it, module paths with it).
func TestFlagsAreTheOnesThisBinaryWasBuiltWith(t *testing.T) {
	flags, err := gobuild.Flags()
	require.NoError(t, err)
	assert.Equal(t, raceBuild, slices.Contains(flags, "-race"), "flags %q, race build %v", flags, raceBuild)

	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	trimmed := !filepath.IsAbs(file)
	assert.Equal(t, trimmed, slices.Contains(flags, "-trimpath"), "flags %q, this file is named %q", flags, file)
	assert.LessOrEqual(t, len(flags), 2, "only -race and -trimpath: %q", flags)
}
