// topology_schema.h — the schema of a topology document as one tree: the keys of every object, what
// a list holds, a line on each. The loader reads each object against its node (a key not in the node
// is an unknown key) and apply_override walks the same tree (a path not in it is an error), so the
// reader, the override paths and this description cannot drift apart.
//
//   const SchemaNode& hbm = *topology_schema().field("cube")->field("hbm");
//   hbm.keys();                       // bandwidth_GBps, capacity_GB, ..., latency_ns (sorted)
//   schema_paths();                   // "name", ..., "cubes.*.pe.tile.k", "network.links.*.from", ...
//
// A list's entries share one node, written "*" in paths ("cubes" is a count or a list of cubes, so it
// has an item node). "_comment" is allowed in every object and is not in the tree.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace cubesim::hw {

struct SchemaNode {
  std::string key;                 // "*" for the entries of a list
  std::string description;         // what the value is, with its unit
  std::vector<SchemaNode> fields;  // an object's keys
  std::vector<SchemaNode> items;   // a list: one node, its entries; anything else: empty

  const SchemaNode* field(std::string_view name) const;  // null when the object has no such key
  const SchemaNode* item() const;                        // null when this is not a list
  std::vector<std::string> keys() const;                 // the fields' keys, sorted
  bool is_leaf() const { return fields.empty() && items.empty(); }
};

// The root: the keys of a resolved document ("extends" and "set" are gone by then).
const SchemaNode& topology_schema();

// Every path under `node`, parents before children, list entries as "*" ("cubes.*.id").
std::vector<std::string> schema_paths(const SchemaNode& node = topology_schema());

}  // namespace cubesim::hw
