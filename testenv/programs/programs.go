// Package programs knows every external program that isthmus' build, tests,
// lab, benchmarks and demo run, and the Debian package each comes from. The
// table is hack/programs.tsv, plain text so that hack/install-deps.sh reads the
// same rows it installs from (package hack embeds it for Go).
//
// Require checks a program before it runs: a missing one fails with its name,
// its package and the script that installs it, rather than as `exit status 127`
// inside an unrelated assertion; a program missing from the table fails too,
// so the table cannot fall behind the code.
package programs

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/isthmus-dev/isthmus/hack"
)

// TablePath is where the table lives in the repository.
const TablePath = "hack/programs.tsv"

// InstallScript installs the packages of the table's missing programs.
const InstallScript = "hack/install-deps.sh"

// StandInPrefix starts the names of programs that tests run on purpose to see
// them missing; the table never lists them.
const StandInPrefix = "isthmus-test-"

var tableText = hack.ProgramsTable

var (
	// ErrUnlisted means the code runs a program that the table does not list.
	ErrUnlisted = errors.New("program not listed")
	// ErrMissing means a listed program is not installed, or its check fails.
	ErrMissing = errors.New("program not installed")
)

// Program is one row of the table.
type Program struct {
	Name    string // as the code names it: "ping", "python3"
	Package string // the Debian package, or several separated by commas; "" when apt does not provide it
	Check   string // a sh command that succeeds when the program is usable; "" means on PATH
	UsedBy  string // who runs it
}

// Table is the parsed table. Its zero value lists nothing.
type Table struct {
	rows []Program
	ok   sync.Map // name -> struct{}: programs already found usable
}

// Parse reads the table format: comment lines start with #, and each row has
// four tab-separated fields (program, package, check, used by), "-" standing
// for an empty package or check.
func Parse(text string) (*Table, error) {
	t := &Table{}
	seen := map[string]bool{}
	for i, line := range strings.Split(text, "\n") {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			return nil, fmt.Errorf("parse program table line %d: %d tab-separated fields, want 4 (program, package, check, used by)", i+1, len(f))
		}
		for j := range f {
			f[j] = strings.TrimSpace(f[j])
			if f[j] == "" {
				return nil, fmt.Errorf("parse program table line %d: field %d is empty (write - for none)", i+1, j+1)
			}
		}
		p := Program{Name: f[0], Package: dash(f[1]), Check: dash(f[2]), UsedBy: f[3]}
		if strings.Contains(p.Name, "/") {
			return nil, fmt.Errorf("parse program table line %d: program %q: list the base name", i+1, p.Name)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("parse program table line %d: program %q listed twice", i+1, p.Name)
		}
		seen[p.Name] = true
		t.rows = append(t.rows, p)
	}
	return t, nil
}

func dash(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

var embedded = sync.OnceValues(func() (*Table, error) { return Parse(tableText) })

// Default returns the table embedded from hack/programs.tsv.
func Default() (*Table, error) { return embedded() }

// Require checks that the program name is listed in the embedded table and
// usable now; see (*Table).Require.
func Require(name string) error {
	t, err := Default()
	if err != nil {
		return err
	}
	return t.Require(name)
}

// All returns the rows in table order.
func (t *Table) All() []Program { return append([]Program(nil), t.rows...) }

// Lookup returns the row of a program; a path (/usr/bin/python3) matches by its
// base name.
func (t *Table) Lookup(name string) (Program, bool) {
	base := filepath.Base(name)
	for _, p := range t.rows {
		if p.Name == base {
			return p, true
		}
	}
	return Program{}, false
}

// Require returns nil when the program name is listed and usable: found on
// PATH (or at its path) and passing its check. Otherwise the error wraps
// ErrUnlisted or ErrMissing and names the program, its package and the install
// script. A path outside the system's bin directories (a binary a test built)
// is only looked for, not looked up. Successes are remembered; failures are
// checked again on the next call.
func (t *Table) Require(name string) error {
	if _, ok := t.ok.Load(name); ok {
		return nil
	}
	if strings.Contains(name, "/") && !systemBin(name) {
		if _, err := exec.LookPath(name); err != nil {
			return fmt.Errorf("%w: %w", ErrMissing, err) // exec's error names the path
		}
		t.ok.Store(name, struct{}{})
		return nil
	}
	p, ok := t.Lookup(name)
	if !ok {
		return fmt.Errorf("%w: %s is run but not listed in %s: add it with the Debian package that provides it", ErrUnlisted, name, TablePath)
	}
	if _, err := exec.LookPath(name); err != nil {
		return fmt.Errorf("%w: %s (%s)", ErrMissing, name, p.installHint())
	}
	if p.Check != "" {
		if out, err := exec.Command("sh", "-c", p.Check).CombinedOutput(); err != nil {
			return fmt.Errorf("%w: %s is there but `%s` fails (%s): %s", ErrMissing, name, p.Check, p.installHint(), strings.TrimSpace(string(out)))
		}
	}
	t.ok.Store(name, struct{}{})
	return nil
}

// installHint says how to get the program.
func (p Program) installHint() string {
	if p.Package == "" {
		return "not from apt: " + p.UsedBy
	}
	if strings.Contains(p.Package, ",") {
		return fmt.Sprintf("Debian packages %s: run %s as root", p.Package, InstallScript)
	}
	return fmt.Sprintf("Debian package %s: run %s as root", p.Package, InstallScript)
}

// systemBin reports whether path names a program in one of the directories
// packages install into, rather than one the tests built.
func systemBin(path string) bool {
	switch filepath.Dir(path) {
	case "/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin":
		return true
	}
	return false
}
