package maps

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// LayoutVersion is the version of the pinned maps' layout: their keys, values,
// types, sizes and flags as bpf/lib/types.h and bpf/lib/maps.h define them. Bump it
// (and set LayoutSpecHash to what TestLayoutVersionCurrent prints) whenever either
// header changes a map's key, value, type, size or flags, or a map is added to or
// removed from AllMaps. A restarted agent whose version differs from the pinned
// layout record migrates the maps (loader/datapath).
const LayoutVersion uint32 = 11

// LayoutSpecHash is SpecHash of the object built for LayoutVersion.
// TestLayoutVersionCurrent fails when the object's map specs no longer hash to it:
// the layout changed and LayoutVersion was not bumped.
const LayoutSpecHash = "919d165eada33c58fe1b146c77d9602a462f99c835d82931cf8204ba24aaa853"

// MapLayout is the name of the pinned layout record: a one-entry array whose value
// is a LayoutRecord. It is created from Go, never by the BPF object.
const MapLayout Name = "layout"

// LayoutRecord is the value of the layout record: the layout version and the spec
// hash of the build that last loaded the datapath successfully.
type LayoutRecord struct {
	Version uint32
	_       uint32
	Hash    [32]byte
}

// CurrentLayout returns the record of this build for the object spec.
func CurrentLayout(spec *ebpf.CollectionSpec) (LayoutRecord, error) {
	h, err := specHash(spec)
	if err != nil {
		return LayoutRecord{}, err
	}
	return LayoutRecord{Version: LayoutVersion, Hash: h}, nil
}

// SpecHash returns the hex SHA-256 of the layout of every map of AllMaps in spec:
// type, key and value sizes and BTF types, max_entries and flags, in AllMaps order.
func SpecHash(spec *ebpf.CollectionSpec) (string, error) {
	h, err := specHash(spec)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h[:]), nil
}

func specHash(spec *ebpf.CollectionSpec) ([32]byte, error) {
	h := sha256.New()
	for _, n := range AllMaps {
		ms, ok := spec.Maps[string(n)]
		if !ok {
			return [32]byte{}, fmt.Errorf("hash map specs: no map %s in the object", n)
		}
		fmt.Fprintf(h, "%s type=%s key=%d value=%d max=%d flags=%#x\n",
			n, ms.Type, ms.KeySize, ms.ValueSize, ms.MaxEntries, ms.Flags)
		io.WriteString(h, " key: ")
		writeType(h, ms.Key, 0)
		io.WriteString(h, "\n value: ")
		writeType(h, ms.Value, 0)
		io.WriteString(h, "\n")
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out, nil
}

// writeType renders the layout of t: names, sizes, member offsets, recursively.
func writeType(w io.Writer, t btf.Type, depth int) {
	if t == nil {
		io.WriteString(w, "<none>")
		return
	}
	if depth > 8 {
		io.WriteString(w, "...")
		return
	}
	switch v := t.(type) {
	case *btf.Int:
		fmt.Fprintf(w, "int(%s,%d,%v)", v.Name, v.Size, v.Encoding)
	case *btf.Typedef:
		fmt.Fprintf(w, "typedef(%s)=", v.Name)
		writeType(w, v.Type, depth+1)
	case *btf.Volatile, *btf.Const, *btf.Restrict:
		writeType(w, btf.UnderlyingType(t), depth+1)
	case *btf.Array:
		fmt.Fprintf(w, "[%d]", v.Nelems)
		writeType(w, v.Type, depth+1)
	case *btf.Struct:
		writeMembers(w, "struct", v.Name, v.Size, v.Members, depth)
	case *btf.Union:
		writeMembers(w, "union", v.Name, v.Size, v.Members, depth)
	case *btf.Enum:
		vals := make([]string, 0, len(v.Values))
		for _, e := range v.Values {
			vals = append(vals, fmt.Sprintf("%s=%d", e.Name, e.Value))
		}
		sort.Strings(vals)
		fmt.Fprintf(w, "enum(%s,%d,%v)", v.Name, v.Size, vals)
	case *btf.Pointer:
		io.WriteString(w, "*")
		writeType(w, v.Target, depth+1)
	default:
		fmt.Fprintf(w, "%T(%s)", t, t.TypeName())
	}
}

func writeMembers(w io.Writer, kind, name string, size uint32, members []btf.Member, depth int) {
	fmt.Fprintf(w, "%s(%s,%d){", kind, name, size)
	for _, m := range members {
		fmt.Fprintf(w, "%s@%d:%d:", m.Name, m.Offset, m.BitfieldSize)
		writeType(w, m.Type, depth+1)
		io.WriteString(w, ";")
	}
	io.WriteString(w, "}")
}
