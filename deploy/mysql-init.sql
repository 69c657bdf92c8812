-- Run once by the mysql image on first start (/docker-entrypoint-initdb.d).
-- binval reads the binlog as `binval`; the demo application uses database `shop`
-- (user app/app is created by MYSQL_USER/MYSQL_PASSWORD/MYSQL_DATABASE in docker-compose.yml).
CREATE DATABASE IF NOT EXISTS shop;

CREATE USER IF NOT EXISTS 'binval'@'%' IDENTIFIED BY 'binval';
GRANT REPLICATION SLAVE, REPLICATION CLIENT, SELECT ON *.* TO 'binval'@'%';
FLUSH PRIVILEGES;
