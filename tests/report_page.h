// The report page in tests: its data document, and the page rendered by headless Chromium
// (Debian `chromium`) with what the page's script drew. Shared by test_report and
// test_study; needs ST_CHROMIUM and ST_ARTIFACT_DIR (screenshots are kept there).
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace st::test {

// The JSON document the page draws (<script id="report-data">), parsed; null when absent.
inline nlohmann::json page_data(const std::string& html) {
  const std::string open = "<script id=\"report-data\" type=\"application/json\">";
  const size_t a = html.find(open);
  if (a == std::string::npos) return nullptr;
  const size_t b = html.find("</script>", a);
  std::string text = html.substr(a + open.size(), b - a - open.size());
  text = std::regex_replace(text, std::regex("<\\\\/"), "</");
  return nlohmann::json::parse(text);
}

struct Render {
  std::string dom, log;
  std::map<std::string, int> panels;  // data-panel -> data-series
  std::filesystem::path png;
};

// Renders a page: the DOM after its scripts ran, the browser's log (every console message
// of the page is logged as "CONSOLE"), the panels the page drew with their series counts,
// and a screenshot of the page's top, ST_ARTIFACT_DIR/shot_name. `scratch`: a folder for
// the browser's profile and logs.
inline Render render_page(const std::filesystem::path& html, const std::string& shot_name,
                          const std::filesystem::path& scratch, const std::string& query = "") {
  namespace fs = std::filesystem;
  auto q = [](const fs::path& p) { return "'" + p.string() + "'"; };
  Render r;
  const std::string chromium = ST_CHROMIUM;
  EXPECT_TRUE(fs::exists(chromium)) << "chromium not found at " << chromium
                                    << " (Debian: apt-get install chromium); the render check needs it";
  const fs::path art = fs::path(ST_ARTIFACT_DIR);
  fs::create_directories(art);
  r.png = art / shot_name;
  const fs::path dom = scratch / (shot_name + ".dom.html"), log = scratch / (shot_name + ".log");
  const std::string common = "timeout 180 " + chromium +
                             " --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run"
                             " --disable-extensions --enable-logging=stderr --v=0 --virtual-time-budget=5000"
                             " --user-data-dir=" + q(scratch / "chromium_profile") + " ";
  const std::string url = "file://" + fs::absolute(html).string() + query;
  EXPECT_EQ(sh(common + "--window-size=1400,2400 --screenshot=" + q(r.png) + " " + q(url) + " >/dev/null 2>" + q(log)),
            0) << slurp(log);
  r.log = slurp(log);
  EXPECT_EQ(sh(common + "--dump-dom " + q(url) + " >" + q(dom) + " 2>" + q(log)), 0) << slurp(log);
  r.log += slurp(log);
  r.dom = slurp(dom);
  const std::regex re("data-panel=\"([^\"]*)\" data-series=\"([0-9]+)\"");
  for (auto it = std::sregex_iterator(r.dom.begin(), r.dom.end(), re); it != std::sregex_iterator(); ++it)
    r.panels[(*it)[1]] = std::stoi((*it)[2]);
  return r;
}

// A page with no script error: the script finished and caught nothing, no console output
// at all (the page logs nothing), nothing blocked or fetched, a screenshot with content.
inline void expect_clean(const Render& r) {
  EXPECT_NE(r.dom.find("data-rendered=\"1\""), std::string::npos) << "the page's script did not finish";
  EXPECT_NE(r.dom.find("data-errors=\"0\""), std::string::npos) << "the page caught a script error";
  EXPECT_EQ(r.log.find("CONSOLE"), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("Uncaught"), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("net::ERR"), std::string::npos) << r.log;
  EXPECT_EQ(r.log.find("Refused to"), std::string::npos) << r.log;
  const std::string p = slurp(r.png);
  ASSERT_GT(p.size(), 24u) << "no screenshot";
  EXPECT_EQ(p.substr(1, 3), "PNG");
  EXPECT_GT(p.size(), 100000u) << "the screenshot is nearly blank";
}

inline std::string dump_panels(const std::map<std::string, int>& m) {
  std::string s;
  for (const auto& [k, v] : m) s += "  " + k + ": " + std::to_string(v) + "\n";
  return s;
}

}  // namespace st::test
