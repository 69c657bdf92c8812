-- Run once by the mysql image on first start (/docker-entrypoint-initdb.d).
-- binval reads the binlog as `binval`; the demo application uses database `shop`
-- (user app/app is created by MYSQL_USER/MYSQL_PASSWORD/MYSQL_DATABASE in docker-compose.yml).
CREATE DATABASE IF NOT EXISTS shop;
-- The demo's mapped table (config/docker.toml maps shop.items); `binval check` needs it to exist.
CREATE TABLE IF NOT EXISTS shop.items (id INT PRIMARY KEY, title VARCHAR(200) NOT NULL, price DECIMAL(10,2) NOT NULL, stock INT NOT NULL, updated DATETIME(3) NOT NULL);

CREATE USER IF NOT EXISTS 'binval'@'%' IDENTIFIED BY 'binval';
GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'binval'@'%';
FLUSH PRIVILEGES;
