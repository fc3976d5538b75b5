#include "common/params.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "common/error.h"
#include "common/log.h"

namespace onebit::param {
namespace {

// The logger reads its own two variables and reports them itself; logging them here would recurse.
bool logged_by_reader(const char* env) {
  return std::string(env) != "ONEBIT_DEBUG" && std::string(env) != "ONEBIT_DEBUG_FILE";
}

Int parse(const char* env, const char* text, Int) {
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text, &end, 0);
  ONEBIT_CHECK(errno == 0 && end != text && *end == '\0', ONEBIT_INVALID_ARGUMENT, env, "='", text,
               "' is not an integer");
  return value;
}
Str parse(const char*, const char* text, const Str&) { return text; }

Int default_value(const char* text, Int) { return std::strtoll(text, nullptr, 0); }
Str default_value(const char* text, const Str&) { return text; }

void check_range(const char* env, const char* text, Int value) {
  for (const Range& range : kRanges) {
    if (std::string(range.env) != env) continue;
    ONEBIT_CHECK(value >= range.min && value <= range.max, ONEBIT_INVALID_ARGUMENT, env, "='", text,
                 "' is out of range: ", range.min, "..", range.max);
  }
}
void check_range(const char*, const char*, const Str&) {}

template <typename T>
T read(const char* env, const char* default_text) {
  const char* text = std::getenv(env);
  if (text == nullptr) return default_value(default_text, T{});
  T value = parse(env, text, T{});
  check_range(env, text, value);
  if (logged_by_reader(env)) {
    ONEBIT_LOG(INFO, env, "=", shown(env, text), " (set by the environment)");
  }
  return value;
}

template <typename T>
const char* type_name();
template <>
const char* type_name<Int>() {
  return "int";
}
template <>
const char* type_name<Str>() {
  return "string";
}

}  // namespace

#define ONEBIT_DEFINE_PARAM(name, type, suffix, def, doc)        \
  const type& name() {                                           \
    static const type value = read<type>("ONEBIT_" suffix, def); \
    return value;                                                \
  }
ONEBIT_PARAMS(ONEBIT_DEFINE_PARAM)
#undef ONEBIT_DEFINE_PARAM

const std::vector<Description>& descriptions() {
#define ONEBIT_DESCRIBE_PARAM(name, type, suffix, def, doc) Description{"ONEBIT_" suffix, type_name<type>(), def, doc},
  static const std::vector<Description> list = {ONEBIT_PARAMS(ONEBIT_DESCRIBE_PARAM)};
#undef ONEBIT_DESCRIBE_PARAM
  return list;
}

bool secret(const char* env) { return std::string(env) == "ONEBIT_AUTH_KEY"; }

std::string shown(const char* env, const char* value) { return secret(env) ? "(set; not shown)" : value; }

std::string markdown_table() {
  std::ostringstream out;
  out << "| variable | type | default | meaning |\n";
  out << "| --- | --- | --- | --- |\n";
  for (const Description& d : descriptions()) {
    std::string def = d.default_text;
    out << "| `" << d.env << "` | " << d.type << " | " << (def.empty() ? "(empty)" : "`" + def + "`") << " | " << d.doc
        << " |\n";
  }
  return out.str();
}

}  // namespace onebit::param
