package redlease_test

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/gobuild"
)

// Every Go block in README.md is a complete program, and compiles: each is
// laid over a package directory that does not exist on disk
// (internal/readme/snippetN, with -overlay), so the README's code is
// compiled against this tree exactly as a user would paste it. The
// compiler runs through go list -export, which compiles each snippet (type
// errors, unused imports and variables fail it) from the build cache's
// export data and does not link; that a snippet declares func main, which
// only the linker would miss, is checked on its syntax tree.
func TestREADMESnippetsCompile(t *testing.T) {
	t.Parallel()
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
		require.True(t, declaresMain(t, src), "README Go block %d has no func main:\n%s", i+1, src)
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
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute) // bounded; a warm cache takes a second or two
	defer cancel()
	// Compiled as this test binary was (-race, -trimpath), so that the
	// packages the blocks import come from the build cache.
	flags, err := gobuild.Flags()
	require.NoError(t, err)
	args := append(append([]string{"list"}, flags...), "-export", "-f", "{{.ImportPath}} {{.Export}}", "-overlay="+ovl)
	cmd := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "README.md's Go blocks do not compile:\n%s", out)
	compiled := 0
	for line := range strings.Lines(string(out)) {
		if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[0], "github.com/redlease/redlease/internal/readme/snippet") {
			compiled++
		}
	}
	require.Equal(t, len(snippets), compiled, "one compiled package per README Go block:\n%s", out)
	t.Logf("%d README Go blocks compile", compiled)
}

// declaresMain says whether src has a top-level func main.
func declaresMain(t *testing.T, src string) bool {
	f, err := parser.ParseFile(token.NewFileSet(), "snippet.go", src, 0)
	require.NoError(t, err, "README Go block does not parse:\n%s", src)
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == "main" {
			return true
		}
	}
	return false
}
