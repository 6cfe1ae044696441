// flags.h: the flag table. Every Megatron flag megatrain accepts, its argument group, type, help
// text and allowed values, bound to its field in Config. CLI parsing, YAML loading and --print-config
// all walk this one table, so a flag exists in all three or in none.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "config/config.h"

namespace mt {

using FieldPtr = std::variant<bool*, int64_t*, double*, std::string*, OptInt*, OptFloat*, OptString*, StringList*, FloatList*>;

struct FlagSpec {
  std::string name;   // without the leading dashes, kebab-case
  std::string group;  // Megatron's argument group
  std::string help;
  std::vector<std::string> choices;  // empty: any value
  FieldPtr (*field)(Config&);
};

// An old spelling: accepted, mapped onto current flags, noted once.
struct AliasSpec {
  std::string name;
  bool takes_value;
  std::string help;
  // Applies the alias; returns the one-line note to print.
  std::string (*apply)(Config&, const std::string& value);
  const char* group = "Old spellings (accepted, mapped)";  // its --help group
  bool takes_list = false;  // one or more values (Megatron's nargs='+'), given to `apply` joined by spaces
};

const std::vector<FlagSpec>& flag_table();
const std::vector<AliasSpec>& alias_table();
const FlagSpec* find_flag(std::string_view name);  // accepts dashes or underscores
const AliasSpec* find_alias(std::string_view name);

// Kebab-case form of a flag or YAML key ("num_layers" -> "num-layers").
std::string normalize_flag_name(std::string_view name);
// Nearest valid flag name (edit distance), for "did you mean" messages.
std::string nearest_flag(std::string_view name);

// Sets a field from text; throws ConfigError naming the flag, the value and the source on bad input.
void set_flag_from_string(Config& cfg, const FlagSpec& spec, const std::string& value, const std::string& source);
void set_flag_from_list(Config& cfg, const FlagSpec& spec, const std::vector<std::string>& values,
                        const std::string& source);
// Clears an optional field (YAML null); list fields become empty; plain fields are an error.
void unset_flag(Config& cfg, const FlagSpec& spec, const std::string& source);
bool parse_bool_text(std::string_view flag, const std::string& value, const std::string& source);
// The field's value as text ("" when unset); type name for --help ("INT", "FLOAT", "TEXT", "LIST"; a list of numbers "FLOAT").
std::string flag_value_text(const Config& cfg, const FlagSpec& spec);
const char* flag_type_name(const FlagSpec& spec);
bool flag_is_bool(const FlagSpec& spec);
bool flag_is_list(const FlagSpec& spec);

}  // namespace mt
