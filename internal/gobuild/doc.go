// Package gobuild serves tests that run the go command themselves (to build
// the CLI, or to compile the README's programs): Flags gives the build flags
// that decide how packages are compiled, as the running test binary was built
// with them, so that such a go command finds in the build cache what the
// test's own build compiled, instead of compiling every dependency a second
// time in another mode.
//
// It reads the binary's embedded build settings (runtime/debug.ReadBuildInfo)
// and nothing else; it is for tests and has no use in production code.
package gobuild
