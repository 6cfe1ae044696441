// yaml_io.cpp: YAML recipe loading and --print-config output.
#include "config/yaml_io.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config/errors.h"
#include "config/flags.h"

namespace mt {
namespace {

// A recipe is a small mapping: this many nodes (aliases counted each time they are used) is far beyond any,
// and bounds the work of an alias bomb (billions of nodes in a few lines).
constexpr int64_t kMaxRecipeNodes = 100000;
constexpr size_t kMaxRecipeBytes = 1 << 20;

// Counts the nodes reachable from `node` (an alias's each time), stopping past the bound.
void count_nodes(const YAML::Node& node, int64_t& budget, const std::string& source) {
  if (--budget < 0) {
    throw ConfigError(source + ": more than " + std::to_string(kMaxRecipeNodes) + " YAML nodes once aliases are expanded: a recipe is a plain "
                      "mapping of flags (remove the anchors and aliases)");
  }
  if (node.IsMap()) {
    for (const auto& kv : node) {
      count_nodes(kv.first, budget, source);
      count_nodes(kv.second, budget, source);
    }
  } else if (node.IsSequence()) {
    for (const auto& item : node) count_nodes(item, budget, source);
  }
}

void apply_node(Config& cfg, const YAML::Node& map, const std::string& source, const std::string& section) {
  std::vector<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) throw ConfigError(source + ": a recipe's keys must be flag names");
    const std::string key = kv.first.as<std::string>();
    const std::string normal = normalize_flag_name(key);
    if (std::find(seen.begin(), seen.end(), normal) != seen.end()) {
      throw ConfigError("key '" + key + "' (" + source + (section.empty() ? "" : ", section '" + section + "'") +
                        ") is given twice: keep one (YAML would silently take one of them)");
    }
    seen.push_back(normal);
    const YAML::Node& val = kv.second;
    const std::string where = source + (section.empty() ? "" : ", section '" + section + "'");
    const std::string keyname = normalize_flag_name(key);
    if (keyname == "config" || keyname == "yaml-cfg") {
      throw ConfigError("key '" + key + "' (" + where + "): a recipe cannot include another recipe; merge them into one file");
    }
    if (const FlagSpec* spec = find_flag(key)) {
      if (val.IsNull()) {
        unset_flag(cfg, *spec, where);
      } else if (val.IsScalar()) {
        set_flag_from_string(cfg, *spec, val.Scalar(), where);
      } else if (val.IsSequence()) {
        std::vector<std::string> items;
        for (const auto& item : val) {
          if (!item.IsScalar()) {
            throw ConfigError("key '" + key + "' (" + where + "): list items must be plain values");
          }
          items.push_back(item.Scalar());
        }
        set_flag_from_list(cfg, *spec, items, where);
      } else {
        throw ConfigError("key '" + key + "' (" + where + "): expected a value, got a mapping");
      }
      continue;
    }
    if (const AliasSpec* alias = find_alias(key)) {
      std::string v;
      if (alias->takes_list && val.IsSequence()) {  // (a list of plain values, joined as the command line's)
        for (const auto& item : val) {
          if (!item.IsScalar()) throw ConfigError("key '" + key + "' (" + where + "): list items must be plain values");
          v += (v.empty() ? "" : " ") + item.Scalar();
        }
      } else if (!val.IsScalar() && !val.IsNull()) {
        throw ConfigError("key '" + key + "' (" + where + "): expected a value");
      } else {
        v = val.IsNull() ? "" : val.Scalar();
      }
      // A boolean old spelling set to false means "not given".
      if (!alias->takes_value && !parse_bool_text(alias->name, v.empty() ? "true" : v, where)) continue;
      if (std::string note = alias->apply(cfg, v); !note.empty()) cfg.notes.push_back(std::move(note));
      continue;
    }
    if (val.IsMap()) {
      apply_node(cfg, val, source, section.empty() ? key : section + "." + key);
      continue;
    }
    throw ConfigError("unknown key '" + key + "' in " + where + ": did you mean '" +
                      [&] {
                        std::string n = nearest_flag(key);
                        if (key.find('_') != std::string::npos) std::replace(n.begin(), n.end(), '-', '_');
                        return n;
                      }() +
                      "'?");
  }
}

std::string format_double(double d) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, res.ptr);
  // Keep it a float to YAML readers: "1" -> "1.0".
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

void apply_yaml_text(Config& cfg, const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(source + ": not valid YAML (line " + std::to_string(e.mark.line + 1) + "): " + e.msg);
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw ConfigError(source + ": a recipe must be a mapping of flag names to values");
  int64_t budget = kMaxRecipeNodes;
  count_nodes(root, budget, source);
  apply_node(cfg, root, source, "");
}

void apply_yaml_file(Config& cfg, const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw ConfigError("recipe '" + path + "' is " + (std::filesystem::is_directory(status) ? "a directory" : "not a regular file") +
                      ": give --config a YAML file");
  }
  if (!ec && std::filesystem::is_regular_file(status)) {
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec && size > kMaxRecipeBytes) {
      throw ConfigError("recipe '" + path + "' is " + std::to_string(size) + " bytes: a recipe is a small YAML mapping (at most " +
                        std::to_string(kMaxRecipeBytes) + " bytes); check the path given to --config");
    }
  }
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read recipe '" + path + "': check the path given to --config");
  std::stringstream ss;
  ss << in.rdbuf();
  apply_yaml_text(cfg, ss.str(), path);
}

std::string config_to_yaml(const Config& cfg_in) {
  Config cfg = cfg_in;  // flag_table() binds mutable fields
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string group;
  for (const auto& spec : flag_table()) {
    if (spec.group != group) {
      group = spec.group;
      out << YAML::Newline << YAML::Comment(group);
    }
    std::string key = spec.name;
    std::replace(key.begin(), key.end(), '-', '_');
    out << YAML::Key << key << YAML::Value;
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, bool>) {
            out << (*p ? "true" : "false");
          } else if constexpr (std::is_same_v<T, int64_t>) {
            out << std::to_string(*p);
          } else if constexpr (std::is_same_v<T, double>) {
            out << format_double(*p);
          } else if constexpr (std::is_same_v<T, std::string>) {
            out << YAML::DoubleQuoted << *p;
          } else if constexpr (std::is_same_v<T, OptInt>) {
            if (*p) out << std::to_string(**p); else out << YAML::Null;
          } else if constexpr (std::is_same_v<T, OptFloat>) {
            if (*p) out << format_double(**p); else out << YAML::Null;
          } else if constexpr (std::is_same_v<T, OptString>) {
            if (*p) out << YAML::DoubleQuoted << **p; else out << YAML::Null;
          } else if constexpr (std::is_same_v<T, FloatList>) {
            out << YAML::Flow << YAML::BeginSeq;
            for (double x : *p) out << format_double(x);
            out << YAML::EndSeq;
          } else {
            out << YAML::Flow << YAML::BeginSeq;
            for (const auto& s : *p) out << YAML::DoubleQuoted << s;
            out << YAML::EndSeq;
          }
        },
        spec.field(cfg));
  }
  out << YAML::EndMap;
  std::string text = out.c_str();
  const Derived& d = cfg.derived;
  std::ostringstream tail;
  tail << "\n# derived (not flags): world size " << d.world_size << ", data parallel " << d.data_parallel_size
       << ", microbatches per iteration " << d.num_microbatches << ", padded vocab " << d.padded_vocab_size << "\n";
  return text + tail.str();
}

}  // namespace mt
