FIXTURES = {
 "data.txt": "apple\nbanana\ncherry\napple\nbanana\napple\ndate\n",
 "nums.txt": "3\n1\n4\n1\n5\n9\n2\n6\n",
 "src/main.rs": "fn main() {\n    // TODO: parse args\n    println!(\"hi\");\n}\n",
 "src/lib.rs": "pub mod util;\n// TODO: docs\npub fn add(a: i32, b: i32) -> i32 { a + b }\n",
 "src/util/helpers.rs": "pub fn helper() {}\n",
 "config.json": "{\"name\": \"demo\", \"version\": \"1.2.3\", \"deps\": [\"a\", \"b\"]}\n",
 "users.csv": "name,age,city\nalice,30,paris\nbob,25,berlin\ncarol,35,rome\ndave,28,oslo\n",
 "notes.md": "# Notes\n- TODO write more\n- done thing\n",
 "log.txt": "INFO start\nWARN low disk\nERROR failed to open\nINFO retry\nERROR timeout\nINFO done\n",
}
