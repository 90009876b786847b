package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// docCommand is an `isthmus plan` line of a fenced block in the docs, with the
// output the doc shows after it (empty when it shows none).
type docCommand struct {
	where string // file:line
	args  []string
	want  string
}

// docCommands returns every `isthmus plan` command line of a fenced block in
// README.md, examples/README.md and docs/*.md whose --objects directory is in
// the repository (a line may start with "$ "; a " #" comment ends it). In a
// block of "$ " lines, the lines after a command up to the next "$ " line or
// the block's end are its output. Commands on placeholders (N, objs) are not
// returned: they take no file of the repository.
func docCommands(t *testing.T) []docCommand {
	t.Helper()
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []docCommand
	for _, f := range append([]string{"README.md", "examples/README.md"}, files...) {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		in, line := false, 0
		var cur *docCommand
		flush := func() {
			if cur != nil {
				cur.want = strings.TrimSuffix(cur.want, "\n")
				out = append(out, *cur)
				cur = nil
			}
		}
		for sc.Scan() {
			line++
			text := sc.Text()
			trimmed := strings.TrimSpace(text)
			if strings.HasPrefix(trimmed, "```") {
				flush()
				in = !in
				continue
			}
			if !in {
				continue
			}
			prompt := strings.HasPrefix(trimmed, "$ ")
			cmd := strings.TrimPrefix(trimmed, "$ ")
			if prompt || strings.HasPrefix(cmd, "isthmus ") {
				flush()
			}
			if !strings.HasPrefix(cmd, "isthmus plan ") {
				if cur != nil && !prompt {
					cur.want += strings.TrimRight(text, " ") + "\n"
				}
				continue
			}
			if i := strings.Index(cmd, " #"); i >= 0 {
				cmd = cmd[:i]
			}
			args := strings.Fields(cmd)[2:]
			if !objectsInRepo(args) {
				continue
			}
			cur = &docCommand{where: f + ":" + strconv.Itoa(line), args: args}
			if !prompt {
				flush() // no output shown after a bare command line
			}
		}
		flush()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		fh.Close()
	}
	return out
}

// objectsInRepo says whether the command's --objects names a directory of the
// repository.
func objectsInRepo(args []string) bool {
	for i, a := range args {
		if a == "--objects" && i+1 < len(args) {
			st, err := os.Stat(args[i+1])
			return err == nil && st.IsDir()
		}
	}
	return false
}

// TestDocCommands runs every `isthmus plan` command the docs show on objects
// of the repository (the examples, the loader's test data) and, where the doc
// shows the output, requires exactly that output: the docs' plans are what
// plan prints today.
func TestDocCommands(t *testing.T) {
	t.Chdir("../..")
	cmds := docCommands(t)
	if len(cmds) < 5 {
		t.Fatalf("found %d plan commands in the docs, want at least 5: is the scanner broken?", len(cmds))
	}
	for _, c := range cmds {
		t.Logf("%s: isthmus plan %s (%d lines of output shown)", c.where, strings.Join(c.args, " "), strings.Count(c.want, "\n")+min(len(c.want), 1))
		stdout, stderr, err := runPlanCmd(t, c.args...)
		if err != nil {
			t.Errorf("%s: isthmus plan %s: %v\n%s", c.where, strings.Join(c.args, " "), err, stderr)
			continue
		}
		if c.want == "" {
			continue
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
			got = append(got, strings.TrimRight(l, " "))
		}
		if g := strings.Join(got, "\n"); g != c.want {
			t.Errorf("%s: isthmus plan %s prints\n%s\nthe doc shows\n%s", c.where, strings.Join(c.args, " "), g, c.want)
		}
	}
}
