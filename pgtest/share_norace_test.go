//go:build !race

package pgtest_test

// raceBuild: this test binary was built with -race.
const raceBuild = false
