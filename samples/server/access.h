// Who may use the server. A server bound to 127.0.0.1 is still reachable from every web page the
// user opens: a page can POST to it (a "simple" text/plain request needs no preflight) and, by
// DNS rebinding, read its answers under the attacker's own host name. So, by default:
//  - Host must name this machine: localhost (or *.localhost), an IP address, or the --host name;
//    a rebound attacker's name is refused (403). --allow-host NAME widens it ("*": any).
//  - Origin, when a browser sends one, must be a loopback origin (http://localhost:3000,
//    http://127.0.0.1:...), the server's own (the chat page), or one given with --allow-origin
//    ("*": any). Others get 403; allowed cross-origin requests get CORS headers and preflights.
//  - POST bodies must be sent as application/json (415 otherwise): a form or text/plain body,
//    which browsers send cross-origin without asking, is never parsed.
//  - With --api-key, every endpoint except the chat page and /health needs
//    "Authorization: Bearer KEY" (401 otherwise), compared in constant time.
#pragma once
#include <string>
#include <vector>

#include <httplib.h>

struct AccessRules {
  std::string bound_host;                    // --host
  std::vector<std::string> allowed_hosts;    // --allow-host (extra Host names, "*": any)
  std::vector<std::string> allowed_origins;  // --allow-origin ("scheme://host[:port]", "*": any)
  std::string api_key;                       // empty: no key needed
};

struct AccessDecision {
  int http_status = 0;  // 0: allowed
  std::string message;
};

// Whether `req` may be answered; `needs_key`: the endpoint is behind --api-key.
AccessDecision check_access(const AccessRules& rules, const httplib::Request& req, bool needs_key);

// Access-Control-Allow-* for an allowed request that came with an Origin (Vary: Origin always).
void add_cors_headers(const httplib::Request& req, httplib::Response& res);
