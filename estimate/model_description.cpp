// ModelDescription: the units of a model, as sizes only, for the memory
// estimator; and the units file that zest-estimate reads.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "zest/config/detail/json_parse.h"
#include "zest/core/check.h"
#include "zest/estimate/memory_estimate.h"

namespace zest {
namespace {

size_t whole_count(double v, const std::string& where) {
  ZEST_CHECK(std::isfinite(v) && v >= 1 && v <= kMaxModelNumel && std::floor(v) == v,
             "{}: {} is not a count (a whole number from 1 to 2^48)", where, v);
  return static_cast<size_t>(v);
}

size_t parse_count(const std::string& token, const std::string& where) {
  char* end = nullptr;
  const double v = std::strtod(token.c_str(), &end);
  ZEST_CHECK(end != token.c_str() && *end == '\0',
             "{}: '{}' is not a parameter count (a whole number such as 4096 or 1e6)", where, token);
  return whole_count(v, where);
}

// "name numel [numel...]" per line; blank lines and '#' comments skipped.
ModelDescription parse_lines(std::string_view text) {
  ModelDescription m;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string line(text.substr(pos, eol - pos));
    pos = eol + 1;
    ++line_no;
    line = line.substr(0, line.find('#'));
    std::vector<std::string> tokens;
    for (size_t i = 0; i < line.size();) {
      const size_t b = line.find_first_not_of(" \t\r", i);
      if (b == std::string::npos) break;
      const size_t e = std::min(line.find_first_of(" \t\r", b), line.size());
      tokens.push_back(line.substr(b, e - b));
      i = e;
    }
    if (tokens.empty()) continue;
    const std::string where = fmt::format("units line {}", line_no);
    ZEST_CHECK(tokens.size() >= 2,
               "{}: unit '{}' has no parameter counts; write \"name numel [numel...]\"", where,
               tokens[0]);
    UnitDescription u{tokens[0], {}, 1};
    for (size_t i = 1; i < tokens.size(); ++i) u.param_numels.push_back(parse_count(tokens[i], where));
    m.units.push_back(std::move(u));
  }
  return m;
}

size_t json_count(const nlohmann::json& v, const std::string& where) {
  ZEST_CHECK(v.is_number(), "{}: expected a number, got {}", where, detail::json_brief(v));
  return whole_count(v.get<double>(), where);
}

std::vector<size_t> json_numels(const nlohmann::json& list, const std::string& where) {
  ZEST_CHECK(list.is_array(), "{}: expected a list of parameter counts, got {}", where, detail::json_brief(list));
  std::vector<size_t> out;
  for (const nlohmann::json& v : list) out.push_back(json_count(v, where));
  return out;
}

// [[numel, ...], {"name": "block", "params": [numel, ...], "count": 48}, ...]
ModelDescription parse_json(std::string_view text) {
  // A units file nests 3 levels ([{"params": [...]}]).
  const nlohmann::json j = detail::parse_json(text, "units", {.max_depth = 4});
  ZEST_CHECK(j.is_array(), "units: a JSON units file is a list of units, got {}", j.type_name());
  ModelDescription m;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& item = j[i];
    const std::string where = fmt::format("units item {}", i);
    UnitDescription u{fmt::format("unit{}", i), {}, 1};
    if (item.is_array()) {
      u.param_numels = json_numels(item, where);
    } else {
      ZEST_CHECK(item.is_object(), "{}: expected a list of counts or an object, got {}", where,
                 detail::json_brief(item));
      for (const auto& [key, value] : item.items()) {
        if (key == "name") {
          ZEST_CHECK(value.is_string(), "{}: \"name\" must be a string", where);
          u.name = value.get<std::string>();
        } else if (key == "params") {
          u.param_numels = json_numels(value, where + " \"params\"");
        } else if (key == "count") {
          u.count = json_count(value, where + " \"count\"");
        } else if (key == "frozen") {
          ZEST_CHECK(value.is_boolean(), "{}: \"frozen\" must be true or false", where);
          u.frozen = value.get<bool>();
        } else {
          ZEST_FAIL("{}: unknown key \"{}\"; allowed keys are name, params, count and frozen", where, key);
        }
      }
    }
    m.units.push_back(std::move(u));
  }
  return m;
}

}  // namespace

size_t UnitDescription::numel() const {
  size_t n = 0;
  for (size_t p : param_numels) n += p;
  return n;
}

ModelDescription ModelDescription::from_total(size_t numel, size_t unit_numel) {
  ZEST_CHECK(numel >= 1, "a model needs at least one parameter");
  ModelDescription m;
  m.total_only = true;
  if (unit_numel == 0 || unit_numel >= numel) {
    m.units.push_back({"model", {numel}, 1});
    return m;
  }
  m.units.push_back({"unit", {unit_numel}, numel / unit_numel});
  if (numel % unit_numel != 0) m.units.push_back({"rest", {numel % unit_numel}, 1});
  return m;
}

size_t ModelDescription::numel() const {
  size_t n = 0;
  for (const UnitDescription& u : units) n += u.count * u.numel();
  return n;
}

size_t ModelDescription::num_units() const {
  size_t n = 0;
  for (const UnitDescription& u : units) n += u.count;
  return n;
}

size_t ModelDescription::largest_unit_numel() const {
  size_t n = 0;
  for (const UnitDescription& u : units) n = std::max(n, u.numel());
  return n;
}

void ModelDescription::validate() const {
  ZEST_CHECK(!units.empty(), "the model has no units: give a parameter count or at least one unit");
  double total = 0;
  for (const UnitDescription& u : units) {
    ZEST_CHECK(!u.name.empty(), "a unit of the model has no name");
    ZEST_CHECK(!u.param_numels.empty(), "unit '{}' has no parameters", u.name);
    ZEST_CHECK(u.count >= 1, "unit '{}' has count 0: a unit is there at least once", u.name);
    for (size_t n : u.param_numels)
      ZEST_CHECK(n >= 1, "unit '{}' has a parameter of 0 elements: every parameter has >= 1", u.name);
    total += static_cast<double>(u.count) * static_cast<double>(u.numel());
  }
  ZEST_CHECK(total <= kMaxModelNumel, "the model has {:.3g} parameters: at most 2^48 are supported",
             total);
}

ModelDescription parse_model_description(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  ModelDescription m = first != std::string_view::npos && text[first] == '['
                           ? parse_json(text)
                           : parse_lines(text);
  ZEST_CHECK(!m.units.empty(), "units: no unit found (one per line: \"name numel [numel...]\")");
  m.validate();
  return m;
}

}  // namespace zest
