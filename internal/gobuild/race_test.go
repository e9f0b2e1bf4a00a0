//go:build race

package gobuild_test

const raceBuild = true
