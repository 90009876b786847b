// Package hack holds the project's set-up scripts and the one table they share
// with the Go code: programs.tsv, every external program the build, tests, lab,
// benchmarks and demo run, with its Debian package. install-deps.sh reads it to
// install what is missing; testenv/programs parses the copy embedded here.
package hack

import _ "embed"

// ProgramsTable is the text of programs.tsv.
//
//go:embed programs.tsv
var ProgramsTable string
