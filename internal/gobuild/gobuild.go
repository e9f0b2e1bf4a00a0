package gobuild

import (
	"errors"
	"runtime/debug"
)

// Flags returns the flags among -race and -trimpath that the running binary
// was built with, in that order: both change every package's compiled form,
// so a go build without them compiles the standard library and every
// dependency again. It returns an error if the binary carries no build
// information.
func Flags() ([]string, error) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return nil, errors.New("gobuild: this binary carries no build information")
	}
	var race, trim bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "-race":
			race = s.Value == "true"
		case "-trimpath":
			trim = s.Value == "true"
		}
	}
	var flags []string
	if race {
		flags = append(flags, "-race")
	}
	if trim {
		flags = append(flags, "-trimpath")
	}
	return flags, nil
}
