package programs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestSourcesRunOnlyListedPrograms scans every Go file of the module for the
// programs it runs and fails for each one the table does not list, so a new
// `exec.Command("nft", ...)` or `l.Exec(ctx, ns, "ss", ...)` cannot land
// without the row that makes hack/install-deps.sh install it. What the scan
// cannot resolve (a binary the test built, a computed argv) is logged;
// testenv.Command checks those at run time. Names starting with StandInPrefix
// are the tests' own absent programs.
func TestSourcesRunOnlyListedPrograms(t *testing.T) {
	tab, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	root := moduleRoot(t)
	runs, unresolved := scanTree(t, root)
	var sawHelper bool
	for _, r := range runs {
		if r.program == "nsenter" && strings.HasSuffix(r.pos.Filename, filepath.Join("testenv", "netns.go")) {
			sawHelper = true // the lab's own exec helper: proof the scan walked testenv
		}
		if _, ok := tab.Lookup(r.program); !ok && !strings.HasPrefix(r.program, StandInPrefix) {
			t.Errorf("%s runs %q, which %s does not list: add a row with its Debian package", r.pos, r.program, TablePath)
		}
	}
	if !sawHelper {
		t.Errorf("the scan of %s did not find testenv.Command running nsenter: the scanner is broken", root)
	}
	for _, u := range unresolved {
		t.Logf("not resolved (a binary built by the tests, or a computed argv): %s", u)
	}
	t.Logf("%d places run a program; %d not resolved", len(runs), len(unresolved))
}

// TestScanFixture pins down what the scanner resolves, on a file that uses
// every form the module uses.
func TestScanFixture(t *testing.T) {
	runs, unresolved := scanTree(t, filepath.Join("testdata", "scan"))
	var got []string
	for _, r := range runs {
		got = append(got, r.program)
	}
	slices.Sort(got)
	got = slices.Compact(got)
	want := []string{"bpftool", "clang", "conststr", "ethtool", "go", "iperf3", "iptables", "iptables-save",
		"llvm-strip", "nsenter", "ping", "python3", "rangeprog", "sysctl", "tshark", "uname"}
	if !slices.Equal(got, want) {
		t.Errorf("programs found:\n got %v\nwant %v", got, want)
	}
	if len(unresolved) != 2 {
		t.Errorf("unresolved %d, want 2 (the built binary and the computed argv): %v", len(unresolved), unresolved)
	}
}

type run struct {
	pos     token.Position
	program string
}

// moduleRoot is the directory of the module's go.mod, above this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("find module root: no go.mod above the test directory")
		}
		dir = parent
	}
}

// scanTree parses every .go file under root (skipping nested modules, testdata
// below root and hidden directories) and returns the programs they run.
func scanTree(t *testing.T, root string) (runs []run, unresolved []string) {
	t.Helper()
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor" || exists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		r, u := scanFile(fset, f)
		runs, unresolved = append(runs, r...), append(unresolved, u...)
		return nil
	})
	if err != nil {
		t.Fatalf("scan %s: %v", root, err)
	}
	return runs, unresolved
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// scanFile finds, in one file: exec.Command(prog, ...) and
// exec.CommandContext(ctx, prog, ...); the lab's helpers Command(ctx, ns,
// argv...) and Exec(ctx, ns, argv...) (testenv.Command, testenv.Exec, l.Exec);
// and //go:generate lines. A program given as a variable is traced to the
// string literals assigned to it in the same function (argv := []string{"ip",
// ...}, append, a range over a table of structs) or to a package constant.
func scanFile(fset *token.FileSet, f *ast.File) (runs []run, unresolved []string) {
	consts := map[string]ast.Expr{}
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						consts[n.Name] = vs.Values[i]
					}
				}
			}
		}
	}
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			if line, ok := strings.CutPrefix(c.Text, "//go:generate "); ok {
				for _, p := range generatePrograms(line) {
					runs = append(runs, run{fset.Position(c.Pos()), p})
				}
			}
		}
	}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		r := resolver{fn: fn.Body, consts: consts}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			arg, slice, ok := programArg(call)
			if !ok {
				return true
			}
			pos := fset.Position(call.Pos())
			progs, resolved := r.resolve(arg, slice, map[string]bool{})
			if !resolved {
				unresolved = append(unresolved, pos.String())
			}
			for _, p := range progs {
				runs = append(runs, run{pos, filepath.Base(p)})
			}
			return true
		})
	}
	return runs, unresolved
}

// programArg returns the argument of an exec call that names the program, and
// whether it is the argv slice (a variadic call: argv...) rather than the name.
func programArg(call *ast.CallExpr) (arg ast.Expr, slice, ok bool) {
	var name string
	var pkg string
	switch fun := call.Fun.(type) {
	case *ast.Ident:
		name = fun.Name
	case *ast.SelectorExpr:
		name = fun.Sel.Name
		if x, ok := fun.X.(*ast.Ident); ok {
			pkg = x.Name
		}
	default:
		return nil, false, false
	}
	switch {
	case pkg == "exec" && name == "Command" && len(call.Args) >= 1:
		return call.Args[0], false, true
	case pkg == "exec" && name == "CommandContext" && len(call.Args) >= 2:
		return call.Args[1], false, true
	case pkg != "exec" && (name == "Command" || name == "CommandAt" || name == "Exec") && len(call.Args) >= 3:
		return call.Args[2], call.Ellipsis.IsValid() && len(call.Args) == 3, true
	}
	return nil, false, false
}

// generatePrograms returns what a //go:generate line runs: its command, and for
// bpf2go the compiler it is given and the llvm-strip it runs by default.
func generatePrograms(line string) []string {
	f := strings.Fields(line)
	if len(f) == 0 {
		return nil
	}
	progs := []string{f[0]}
	if len(f) >= 3 && f[0] == "go" && f[1] == "tool" && f[2] == "bpf2go" {
		progs = append(progs, "llvm-strip")
		if i := slices.Index(f, "-cc"); i >= 0 && i+1 < len(f) {
			progs = append(progs, f[i+1])
		}
	}
	return progs
}

// resolver traces expressions to string literals within one function.
type resolver struct {
	fn     *ast.BlockStmt
	consts map[string]ast.Expr
}

// resolve returns the programs e may name (e is the argv slice when slice is
// set, so its first element counts) and whether every path was resolved.
func (r resolver) resolve(e ast.Expr, slice bool, seen map[string]bool) ([]string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(e.Value); err == nil && !slice && e.Kind == token.STRING {
			return []string{s}, true
		}
	case *ast.CompositeLit:
		if slice && len(e.Elts) > 0 {
			return r.resolve(e.Elts[0], false, seen)
		}
	case *ast.CallExpr:
		if id, ok := e.Fun.(*ast.Ident); ok && id.Name == "append" && slice && len(e.Args) > 0 {
			return r.resolve(e.Args[0], true, seen)
		}
	case *ast.Ident:
		if seen[e.Name] {
			return nil, true // argv = append(argv, ...): the other assignments answer
		}
		seen[e.Name] = true
		if v, ok := r.consts[e.Name]; ok {
			return r.resolve(v, slice, seen)
		}
		return r.all(r.values(e.Name, ""), slice, seen)
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			return r.all(r.values(x.Name, e.Sel.Name), slice, seen)
		}
	}
	return nil, false
}

func (r resolver) all(values []ast.Expr, slice bool, seen map[string]bool) ([]string, bool) {
	if len(values) == 0 {
		return nil, false
	}
	var progs []string
	resolved := true
	for _, v := range values {
		p, ok := r.resolve(v, slice, seen)
		progs = append(progs, p...)
		resolved = resolved && ok
	}
	return progs, resolved
}

// values returns what the function assigns to the variable name, or with
// field set, what a range over a composite literal of structs binds to
// name.field; a range over a literal list binds each element to name.
func (r resolver) values(name, field string) []ast.Expr {
	var out []ast.Expr
	ast.Inspect(r.fn, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if field != "" || len(n.Lhs) != len(n.Rhs) {
				return true
			}
			for i, l := range n.Lhs {
				if id, ok := l.(*ast.Ident); ok && id.Name == name {
					out = append(out, n.Rhs[i])
				}
			}
		case *ast.ValueSpec:
			for i, id := range n.Names {
				if id.Name == name && field == "" && i < len(n.Values) {
					out = append(out, n.Values[i])
				}
			}
		case *ast.RangeStmt:
			id, ok := n.Value.(*ast.Ident)
			lit, isLit := n.X.(*ast.CompositeLit)
			if !ok || id.Name != name || !isLit {
				return true
			}
			if field == "" {
				out = append(out, lit.Elts...)
				return true
			}
			out = append(out, fieldValues(lit, field)...)
		}
		return true
	})
	return out
}

// fieldValues returns field's value in each element of a []struct{...}{...}
// literal, keyed or positional.
func fieldValues(lit *ast.CompositeLit, field string) []ast.Expr {
	arr, ok := lit.Type.(*ast.ArrayType)
	if !ok {
		return nil
	}
	st, ok := arr.Elt.(*ast.StructType)
	if !ok {
		return nil
	}
	index, i := -1, 0
	for _, f := range st.Fields.List {
		for _, n := range f.Names {
			if n.Name == field {
				index = i
			}
			i++
		}
	}
	if index < 0 {
		return nil
	}
	var out []ast.Expr
	for _, e := range lit.Elts {
		el, ok := e.(*ast.CompositeLit)
		if !ok {
			continue
		}
		for j, v := range el.Elts {
			if kv, ok := v.(*ast.KeyValueExpr); ok {
				if k, ok := kv.Key.(*ast.Ident); ok && k.Name == field {
					out = append(out, kv.Value)
				}
			} else if j == index {
				out = append(out, v)
			}
		}
	}
	return out
}
