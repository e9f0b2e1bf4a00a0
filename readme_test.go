package redlease_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every Go block in README.md is a complete program, and builds: each is
// laid over a package directory that does not exist on disk
// (internal/readme/snippetN, with go build -overlay), so the README's code
// is compiled against this tree exactly as a user would paste it.
func TestREADMESnippetsCompile(t *testing.T) {
	text, err := os.ReadFile("README.md")
	require.NoError(t, err)
	var snippets []string
	rest := string(text)
	for range 100 { // bounded: a README has a handful
		i := strings.Index(rest, "```go\n")
		if i < 0 {
			break
		}
		rest = rest[i+len("```go\n"):]
		j := strings.Index(rest, "\n```")
		require.GreaterOrEqual(t, j, 0, "unterminated go block in README.md")
		snippets = append(snippets, rest[:j+1])
		rest = rest[j:]
	}
	require.NotEmpty(t, snippets, "README.md has Go blocks")

	root, err := os.Getwd()
	require.NoError(t, err)
	dir := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	for i, src := range snippets {
		require.True(t, strings.HasPrefix(src, "package main\n"), "README Go block %d is not a complete program:\n%s", i+1, src)
		file := filepath.Join(dir, "snippet"+string(rune('a'+i))+".go")
		require.NoError(t, os.WriteFile(file, []byte(src), 0o644))
		pkg := "./internal/readme/snippet" + string(rune('a'+i))
		overlay[filepath.Join(root, pkg, "main.go")] = file
		pkgs = append(pkgs, pkg)
	}
	js, err := json.Marshal(map[string]any{"Replace": overlay})
	require.NoError(t, err)
	ovl := filepath.Join(dir, "overlay.json")
	require.NoError(t, os.WriteFile(ovl, js, 0o644))
	cmd := exec.Command("go", append([]string{"build", "-overlay=" + ovl}, pkgs...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "README.md's Go blocks do not build:\n%s", out)
	t.Logf("%d README Go blocks build", len(snippets))
}
