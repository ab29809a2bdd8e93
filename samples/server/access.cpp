#include "access.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// "name:port", "[v6]:port" or "name" → the host part without brackets, lower case.
std::string host_part(const std::string& authority) {
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    return close == std::string::npos ? authority : lower(authority.substr(1, close - 1));
  }
  const size_t colon = authority.find(':');
  return lower(colon == std::string::npos ? authority : authority.substr(0, colon));
}

bool is_ip_literal(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// This machine by name or loopback address: what a local app or page on localhost uses.
bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || ends_with(host, ".localhost") || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

bool host_allowed(const AccessRules& rules, const std::string& host_header) {
  if (host_header.empty()) return true;  // HTTP/1.0 clients; browsers always send Host
  if (contains(rules.allowed_hosts, "*")) return true;
  const std::string host = host_part(host_header);
  // An IP address cannot be rebound to another machine; a name can.
  return is_loopback_host(host) || is_ip_literal(host) || host == lower(rules.bound_host) ||
         contains(rules.allowed_hosts, host);
}

bool origin_allowed(const AccessRules& rules, const std::string& origin, const std::string& host_header) {
  if (contains(rules.allowed_origins, "*") || contains(rules.allowed_origins, origin)) return true;
  const size_t scheme_end = origin.find("://");
  if (scheme_end == std::string::npos) return false;  // "null" (sandboxed frames, file:// pages)
  const std::string authority = lower(origin.substr(scheme_end + 3));
  return authority == lower(host_header) || is_loopback_host(host_part(authority));
}

// Time independent of where the first difference is (the key's length is not the secret).
bool equal_in_constant_time(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string trim(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t");
  return first == std::string::npos ? "" : s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

}  // namespace

AccessDecision check_access(const AccessRules& rules, const httplib::Request& req, bool needs_key) {
  const std::string host = req.get_header_value("Host");
  if (!host_allowed(rules, host))
    return {403, "Host '" + host + "' is not this server's name (start it with --allow-host " + host_part(host) +
                     " to allow it)"};
  if (req.has_header("Origin") && !origin_allowed(rules, req.get_header_value("Origin"), host))
    return {403, "requests from origin '" + req.get_header_value("Origin") +
                     "' are not allowed (start the server with --allow-origin " + req.get_header_value("Origin") +
                     " to allow them)"};
  if (needs_key && !rules.api_key.empty()) {
    const std::string auth = req.get_header_value("Authorization");
    const std::string bearer = "Bearer ";
    if (auth.compare(0, bearer.size(), bearer) != 0 || !equal_in_constant_time(auth.substr(bearer.size()), rules.api_key))
      return {401, "this server needs an API key: send 'Authorization: Bearer KEY'"};
  }
  if (req.method == "POST") {
    const std::string type = lower(req.get_header_value("Content-Type"));
    if (trim(type.substr(0, type.find(';'))) != "application/json")
      return {415, "send the body as JSON with 'Content-Type: application/json' (curl: -H 'Content-Type: "
                   "application/json'), not '" + req.get_header_value("Content-Type") + "'"};
  }
  return {};
}

void add_cors_headers(const httplib::Request& req, httplib::Response& res) {
  res.set_header("Vary", "Origin");
  if (!req.has_header("Origin")) return;
  res.set_header("Access-Control-Allow-Origin", req.get_header_value("Origin"));
  res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
  res.set_header("Access-Control-Allow-Headers", "Content-Type, Authorization");
  res.set_header("Access-Control-Max-Age", "600");
}
